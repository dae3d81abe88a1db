// Reads DRA device metadata files as a workload would, with the decoder of
// k8s.io/dynamic-resource-allocation (its devicemetadata package, validation on),
// and prints one JSON line per file: what it decoded, or why it could not.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

type verdict struct {
	File       string                           `json:"file"`
	Error      string                           `json:"error,omitempty"`
	Invalid    string                           `json:"invalid,omitempty"`
	Decoded    string                           `json:"decoded,omitempty"`
	Metadata   *metadatav1beta1.DeviceMetadata `json:"metadata,omitempty"`
}

func main() {
	out := json.NewEncoder(os.Stdout)
	for _, path := range os.Args[1:] {
		v := verdict{File: path}
		f, err := os.Open(path)
		if err != nil {
			v.Error = err.Error()
		} else {
			var dm metadatav1beta1.DeviceMetadata
			var invalid error
			var gvk schema.GroupVersionKind
			err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(f),
				&dm, devicemetadata.DecodeMetadataWithValidationResult(&invalid),
				devicemetadata.DecodeMetadataStoreGVKResult(&gvk))
			_ = f.Close()
			if err != nil {
				v.Error = err.Error()
			} else {
				v.Decoded = gvk.String()
				v.Metadata = &dm
				if invalid != nil {
					v.Invalid = invalid.Error()
				}
			}
		}
		if err := out.Encode(v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
