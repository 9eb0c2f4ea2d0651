// Command kstatus prints what Flux's health checks conclude about Kubernetes objects: it reads a
// JSON array of objects (as `kubectl get -o json` writes each item) on stdin and writes a JSON
// array of {"status", "message"}, one per object in order, computed by the same library Flux
// uses (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func compute(input io.Reader) ([]verdict, error) {
	var raws []json.RawMessage
	if err := json.NewDecoder(input).Decode(&raws); err != nil {
		return nil, fmt.Errorf("stdin is not a JSON array of objects: %w", err)
	}
	out := make([]verdict, 0, len(raws))
	for i, raw := range raws {
		// Unstructured's own decoder keeps integers int64, which kstatus's generation check needs
		// (encoding/json would make them float64 and the check would error).
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
		res, err := status.Compute(u)
		if err != nil {
			return nil, fmt.Errorf("object %d (%s %s/%s): %w", i, u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		out = append(out, verdict{Status: res.Status.String(), Message: res.Message})
	}
	return out, nil
}

func main() {
	verdicts, err := compute(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(verdicts); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
