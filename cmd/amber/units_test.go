package main

import (
	"testing"
	"time"
)

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

func TestParseExpiry(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)
	for in, want := range map[string]time.Time{
		"24h":                  now.Add(24 * time.Hour).Truncate(time.Second),
		"30d":                  now.Add(30 * 24 * time.Hour).Truncate(time.Second),
		"2031-05-06T07:08:09Z": time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC),
	} {
		got, err := parseExpiry(in, now)
		if err != nil || got == nil || !got.Equal(want) {
			t.Errorf("parseExpiry(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if got, err := parseExpiry("", now); got != nil || err != nil {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"soon", "-1h", "0d", "xd"} {
		if _, err := parseExpiry(bad, now); err == nil {
			t.Errorf("parseExpiry(%q) accepted", bad)
		}
	}
}
