// cdi_oracle is the reference CDI implementation (Debian's container-device-interface 0.5.2)
// wrapped for differential tests. It reads one JSON request per line on stdin:
//
//	{"specs": {"NAME.json": "<file text>", ...}, "oci": {...}, "devices": ["vendor/class=name"]}
//
// writes the spec files to a fresh directory, loads it as a CDI spec dir, injects the devices
// into the OCI spec and prints one JSON line:
//
//	{"devices": [...], "spec_errors": {"NAME.json": "..."}, "oci": {...}} or {..., "error": "..."}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/container-orchestrated-devices/container-device-interface/pkg/cdi"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

type request struct {
	Specs   map[string]string `json:"specs"`
	OCI     json.RawMessage   `json:"oci"`
	Devices []string          `json:"devices"`
}

type response struct {
	Devices    []string          `json:"devices"`
	SpecErrors map[string]string `json:"spec_errors"`
	OCI        *oci.Spec         `json:"oci,omitempty"`
	Error      string            `json:"error,omitempty"`
}

func handle(req request) (resp response) {
	resp.SpecErrors = map[string]string{}
	defer func() {
		if r := recover(); r != nil {
			resp.Error = fmt.Sprintf("panic: %v", r)
		}
	}()
	dir, err := os.MkdirTemp("", "cdi-oracle-")
	if err != nil {
		resp.Error = err.Error()
		return
	}
	defer os.RemoveAll(dir)
	for name, text := range req.Specs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			resp.Error = err.Error()
			return
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		resp.Error = err.Error()
		return
	}
	for path, errs := range cache.GetErrors() {
		if len(errs) > 0 {
			resp.SpecErrors[filepath.Base(path)] = errs[0].Error()
		}
	}
	resp.Devices = cache.ListDevices()
	sort.Strings(resp.Devices)
	var spec oci.Spec
	if err := json.Unmarshal(req.OCI, &spec); err != nil {
		resp.Error = "bad OCI spec: " + err.Error()
		return
	}
	if _, err := cache.InjectDevices(&spec, req.Devices...); err != nil {
		resp.Error = err.Error()
		return
	}
	resp.OCI = &spec
	return
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			out.Encode(response{Error: "bad request: " + err.Error()})
			continue
		}
		if err := out.Encode(handle(req)); err != nil {
			os.Exit(1)
		}
	}
}
