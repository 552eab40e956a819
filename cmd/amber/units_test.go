package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"256Mi": 256 << 20, "1Gi": 1 << 30, "1.5G": 1.5e9, "4096": 4096, "10Ki": 10240} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1Mi", "0", "12Qi"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

func TestParseCPUs(t *testing.T) {
	for in, want := range map[string]int64{"1": 1000, "0.5": 500, "250m": 250, "2": 2000} {
		if got, err := parseCPUs(in); err != nil || got != want {
			t.Errorf("parseCPUs(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "zero", "-1", "0", "5x"} {
		if _, err := parseCPUs(in); err == nil {
			t.Errorf("parseCPUs(%q) accepted", in)
		}
	}
}
