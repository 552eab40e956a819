package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeSuffixes = []struct {
	s string
	m float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1},
}

// parseSize reads a byte size: "256Mi", "1Gi", "1.5G", "1048576".
func parseSize(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), 1.0
	for _, suf := range sizeSuffixes {
		if strings.HasSuffix(num, suf.s) {
			num, mult = strings.TrimSuffix(num, suf.s), suf.m
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f <= 0 || math.IsInf(f, 0) || f*mult > math.MaxInt64/2 {
		return 0, usageError{fmt.Errorf("size %q is not a positive size like 256Mi, 1Gi or 1048576", s)}
	}
	return int64(f * mult), nil
}

// parseCPUs reads a CPU amount as millicpus: "1" → 1000, "0.5" → 500, "250m" → 250.
func parseCPUs(s string) (int64, error) {
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil || n <= 0 {
			return 0, usageError{fmt.Errorf("cpus %q is not like 1, 0.5 or 500m", s)}
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f > 1024 {
		return 0, usageError{fmt.Errorf("cpus %q is not like 1, 0.5 or 500m", s)}
	}
	return int64(math.Round(f * 1000)), nil
}

// formatSize writes bytes in binary units.
func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	if n >= 1<<20 {
		return fmt.Sprintf("%.1fMi", float64(n)/(1<<20))
	}
	return strconv.FormatInt(n, 10)
}
