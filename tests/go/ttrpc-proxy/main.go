// ttrpc-proxy is the benchmark's reference: a pass-through agent proxy written with Go's ttrpc
// (containerd/ttrpc). It serves grpc.Health and grpc.AgentService on a unix socket and forwards
// every call's payload, metadata and deadline over one upstream ttrpc connection.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/containerd/ttrpc"
)

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

func forward(client *ttrpc.Client, service, method string) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(interface{}) error) (interface{}, error) {
		var req raw
		if err := unmarshal(&req); err != nil {
			return nil, err
		}
		if md, ok := ttrpc.GetMetadata(ctx); ok {
			ctx = ttrpc.WithMetadata(ctx, md)
		}
		var resp raw
		if err := client.Call(ctx, service, method, &req, &resp); err != nil {
			return nil, err
		}
		return &resp, nil
	}
}

func main() {
	socket := flag.String("socket", "", "unix socket to serve the shim on")
	upstream := flag.String("upstream", "", "HOST:PORT of the pod VM forwarder")
	flag.Parse()

	conn, err := net.Dial("tcp", *upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	client := ttrpc.NewClient(conn)
	os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
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
		"Check":   forward(client, "grpc.Health", "Check"),
		"Version": forward(client, "grpc.Health", "Version"),
	})
	methods := map[string]ttrpc.Method{}
	for _, m := range agentMethods {
		methods[m] = forward(client, "grpc.AgentService", m)
	}
	s.Register("grpc.AgentService", methods)
	fmt.Printf("listening %s\n", *socket)
	os.Stdout.Sync()
	if err := s.Serve(context.Background(), l); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}
