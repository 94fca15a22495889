// ttrpc-call makes one unary call with Go's ttrpc client (containerd/ttrpc) and prints one JSON
// line: {"code": N, "message": "...", "payload_hex": "..."}. Exit 0 when a status came back
// (any code), 1 when the call never completed (connect or transport failure).
//
//	ttrpc-call -socket S -service hypervisor.Hypervisor -method CreateVM -payload-hex 0a03... \
//	    -md k=v -md k2=v2 -timeout 30s
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"strings"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type raw struct{ b []byte }

func (m *raw) Reset()                   { m.b = nil }
func (m *raw) String() string           { return fmt.Sprintf("raw(%d)", len(m.b)) }
func (m *raw) ProtoMessage()            {}
func (m *raw) Marshal() ([]byte, error) { return m.b, nil }
func (m *raw) Unmarshal(b []byte) error { m.b = append([]byte(nil), b...); return nil }

type mdFlag []string

func (m *mdFlag) String() string     { return strings.Join(*m, ",") }
func (m *mdFlag) Set(v string) error { *m = append(*m, v); return nil }

type result struct {
	Code       int    `json:"code"`
	Message    string `json:"message"`
	PayloadHex string `json:"payload_hex"`
}

func dial(socket, addr, ca, cert, key string) (net.Conn, error) {
	if socket != "" {
		return net.Dial("unix", socket)
	}
	if ca == "" {
		return net.Dial("tcp", addr)
	}
	pem, err := ioutil.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	host, _, _ := net.SplitHostPort(addr)
	cfg.ServerName = host
	return tls.Dial("tcp", addr, cfg)
}

func main() {
	socket := flag.String("socket", "", "unix socket to dial")
	addr := flag.String("addr", "", "HOST:PORT to dial instead of -socket")
	ca := flag.String("tls-ca", "", "CA of the server (enables TLS with -addr)")
	cert := flag.String("tls-cert", "", "client certificate")
	key := flag.String("tls-key", "", "client key")
	service := flag.String("service", "", "service name, e.g. hypervisor.Hypervisor")
	method := flag.String("method", "", "method name, e.g. CreateVM")
	payloadHex := flag.String("payload-hex", "", "request payload, hex")
	timeout := flag.Duration("timeout", 0, "call timeout (0: none)")
	var md mdFlag
	flag.Var(&md, "md", "metadata KEY=VALUE (repeatable)")
	flag.Parse()

	payload, err := hex.DecodeString(*payloadHex)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payload-hex:", err)
		os.Exit(2)
	}
	conn, err := dial(*socket, *addr, *ca, *cert, *key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()

	ctx := context.Background()
	if len(md) > 0 {
		m := ttrpc.MD{}
		for _, kv := range md {
			parts := strings.SplitN(kv, "=", 2)
			if len(parts) != 2 {
				fmt.Fprintln(os.Stderr, "md: want KEY=VALUE:", kv)
				os.Exit(2)
			}
			m.Append(parts[0], parts[1])
		}
		ctx = ttrpc.WithMetadata(ctx, m)
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	var resp raw
	err = client.Call(ctx, *service, *method, &raw{b: payload}, &resp)
	out := result{PayloadHex: hex.EncodeToString(resp.b)}
	if err != nil {
		if st, ok := status.FromError(err); ok {
			out.Code, out.Message = int(st.Code()), st.Message()
		} else if errors.Is(err, context.DeadlineExceeded) {
			out.Code, out.Message = int(codes.DeadlineExceeded), err.Error()
		} else {
			fmt.Fprintln(os.Stderr, "call:", err)
			os.Exit(1)
		}
	}
	enc, _ := json.Marshal(out)
	fmt.Println(string(enc))
}
