// ttrpc-bench drives unary calls with Go's ttrpc client over one connection from C goroutines
// for a fixed time and prints one JSON line: calls, calls_per_s, p50_us, p99_us.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
)

type raw struct{ b []byte }

func (m *raw) Reset()                   { m.b = nil }
func (m *raw) String() string           { return fmt.Sprintf("raw(%d)", len(m.b)) }
func (m *raw) ProtoMessage()            {}
func (m *raw) Marshal() ([]byte, error) { return m.b, nil }
func (m *raw) Unmarshal(b []byte) error { m.b = append([]byte(nil), b...); return nil }

func main() {
	socket := flag.String("socket", "", "unix socket")
	addr := flag.String("addr", "", "HOST:PORT instead of -socket")
	service := flag.String("service", "grpc.AgentService", "service")
	method := flag.String("method", "StatsContainer", "method")
	size := flag.Int("payload-size", 64, "request payload bytes")
	concurrency := flag.Int("concurrency", 1, "concurrent callers on the one connection")
	warmup := flag.Duration("warmup", 300*time.Millisecond, "untimed warm-up")
	duration := flag.Duration("duration", 2*time.Second, "timed run")
	flag.Parse()

	network, target := "unix", *socket
	if *addr != "" {
		network, target = "tcp", *addr
	}
	conn, err := net.Dial(network, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = byte(i)
	}

	run := func(d time.Duration, record bool) ([]time.Duration, error) {
		var mu sync.Mutex
		var all []time.Duration
		var firstErr error
		stop := time.Now().Add(d)
		var wg sync.WaitGroup
		for w := 0; w < *concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for time.Now().Before(stop) {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					start := time.Now()
					var resp raw
					err := client.Call(ctx, *service, *method, &raw{b: payload}, &resp)
					cancel()
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					if record {
						mine = append(mine, time.Since(start))
					}
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return all, firstErr
	}
	if _, err := run(*warmup, false); err != nil {
		fmt.Fprintln(os.Stderr, "call:", err)
		os.Exit(1)
	}
	began := time.Now()
	lat, err := run(*duration, true)
	elapsed := time.Since(began).Seconds()
	if err != nil {
		fmt.Fprintln(os.Stderr, "call:", err)
		os.Exit(1)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds())
	}
	out := map[string]float64{
		"calls":       float64(len(lat)),
		"seconds":     elapsed,
		"calls_per_s": float64(len(lat)) / elapsed,
		"p50_us":      pct(0.50),
		"p99_us":      pct(0.99),
	}
	enc, _ := json.Marshal(out)
	fmt.Println(string(enc))
}
