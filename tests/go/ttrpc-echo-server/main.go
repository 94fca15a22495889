// ttrpc-echo-server plays the pod VM side in tests: a Go ttrpc (containerd/ttrpc) server.
//
// grpc.Health/Check answers SERVING; grpc.Health/Version answers a VersionCheckResponse; every
// grpc.AgentService method answers with a ttrpc Request message describing what it received
// (service, method, payload, remaining timeout in ns, metadata sorted by key). Metadata
// "x-sleep: DURATION" delays the answer (or until the deadline), "x-fail: CODE:MESSAGE" answers
// with that status. Prints "listening ADDR" once it accepts connections.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// raw carries protobuf bytes through gogo's codec untouched.
type raw struct{ b []byte }

func (m *raw) Reset()                   { m.b = nil }
func (m *raw) String() string           { return fmt.Sprintf("raw(%d)", len(m.b)) }
func (m *raw) ProtoMessage()            {}
func (m *raw) Marshal() ([]byte, error) { return m.b, nil }
func (m *raw) Unmarshal(b []byte) error { m.b = append([]byte(nil), b...); return nil }

var agentMethods = []string{
	"CreateContainer", "StartContainer", "RemoveContainer", "ExecProcess", "SignalProcess",
	"WaitProcess", "UpdateContainer", "UpdateEphemeralMounts", "StatsContainer", "PauseContainer",
	"ResumeContainer", "RemoveStaleVirtiofsShareMounts", "GetDiagnosticData", "WriteStdin",
	"ReadStdout", "ReadStderr", "CloseStdin", "TtyWinResize", "UpdateInterface", "UpdateRoutes",
	"ListInterfaces", "ListRoutes", "AddARPNeighbors", "GetIPTables", "SetIPTables", "GetMetrics",
	"MemAgentMemcgSet", "MemAgentCompactSet", "CreateSandbox", "DestroySandbox", "OnlineCPUMem",
	"ReseedRandomDev", "GetGuestDetails", "MemHotplugByProbe", "SetGuestDateTime", "CopyFile",
	"GetOOMEvent", "AddSwap", "AddSwapPath", "GetVolumeStats", "ResizeVolume", "SetPolicy",
}

func echo(service, method string) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
		var req raw
		if err := unmarshal(&req); err != nil {
			return nil, err
		}
		md, _ := ttrpc.GetMetadata(ctx)
		if v, ok := md.Get("x-fail"); ok {
			parts := strings.SplitN(v[0], ":", 2)
			code, _ := strconv.Atoi(parts[0])
			msg := ""
			if len(parts) > 1 {
				msg = parts[1]
			}
			return nil, status.Error(codes.Code(code), msg)
		}
		if v, ok := md.Get("x-sleep"); ok {
			d, err := time.ParseDuration(v[0])
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "x-sleep: %v", err)
			}
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		out := &ttrpc.Request{Service: service, Method: method, Payload: req.b}
		if dl, ok := ctx.Deadline(); ok {
			out.TimeoutNano = time.Until(dl).Nanoseconds()
		}
		keys := make([]string, 0, len(md))
		for k := range md {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range md[k] {
				out.Metadata = append(out.Metadata, &ttrpc.KeyValue{Key: k, Value: v})
			}
		}
		return out, nil
	}
}

func constant(b []byte) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
		var req raw
		if err := unmarshal(&req); err != nil {
			return nil, err
		}
		return &raw{b: b}, nil
	}
}

func listen(spec, cert, key, clientCA string) (net.Listener, error) {
	network, addr := "tcp", spec
	if i := strings.Index(spec, ":"); i > 0 && (spec[:i] == "tcp" || spec[:i] == "unix") {
		network, addr = spec[:i], spec[i+1:]
	}
	l, err := net.Listen(network, addr)
	if err != nil || cert == "" {
		return l, err
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := ioutil.ReadFile(clientCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tls.NewListener(l, cfg), nil
}

func main() {
	spec := flag.String("listen", "tcp:127.0.0.1:0", "tcp:HOST:PORT or unix:PATH")
	cert := flag.String("tls-cert", "", "server certificate (enables TLS)")
	key := flag.String("tls-key", "", "server key")
	clientCA := flag.String("tls-client-ca", "", "CA that client certificates must chain to (mTLS)")
	flag.Parse()

	l, err := listen(*spec, *cert, *key, *clientCA)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	s, err := ttrpc.NewServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s.Register("grpc.Health", map[string]ttrpc.Method{
		"Check":   constant([]byte{0x08, 0x01}),
		"Version": constant(append([]byte{0x0a, 0x05}, []byte("1.1.1")...)),
	})
	methods := map[string]ttrpc.Method{}
	for _, m := range agentMethods {
		methods[m] = echo("grpc.AgentService", m)
	}
	s.Register("grpc.AgentService", methods)
	fmt.Printf("listening %s\n", l.Addr().String())
	os.Stdout.Sync()
	if err := s.Serve(context.Background(), l); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}
