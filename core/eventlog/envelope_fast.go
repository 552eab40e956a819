package eventlog

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// decodeCanonical parses the JSON body of an envelope in exactly the form
// Encode writes — fields in declaration order, no whitespace, strings
// without escapes — several times faster than encoding/json. It reports
// false for anything else, and Decode then takes the general path; so it
// never decides whether bytes are valid, only how fast valid ones are read.
// FuzzDecodeEnvelope checks that both paths agree whenever this one answers.
func decodeCanonical(body []byte) (Event, bool) {
	var ev Event
	p := canonParser{b: body}
	ok := p.lit(`{"tenant":`) && p.str(&ev.Tenant) &&
		p.lit(`,"stream":`) && p.str(&ev.Stream) &&
		p.lit(`,"seq":`) && p.uint(&ev.Seq) &&
		p.lit(`,"id":`) && p.str(&ev.ID) &&
		p.lit(`,"type":`) && p.str(&ev.Type) &&
		p.lit(`,"version":`) && p.int(&ev.Version) &&
		p.lit(`,"time":`) && p.time(&ev.Time) &&
		(!p.peek(`,"causation_id":`) || p.lit(`,"causation_id":`) && p.str(&ev.CausationID)) &&
		p.lit(`,"payload":`) && p.payload(&ev.Payload) &&
		(!p.peek(`,"checkpoint_ref":`) || p.lit(`,"checkpoint_ref":`) && p.str(&ev.CheckpointRef)) &&
		p.lit(`}`) && len(p.b) == 0
	return ev, ok
}

type canonParser struct{ b []byte }

func (p *canonParser) peek(s string) bool { return len(p.b) >= len(s) && string(p.b[:len(s)]) == s }

func (p *canonParser) lit(s string) bool {
	if !p.peek(s) {
		return false
	}
	p.b = p.b[len(s):]
	return true
}

// str reads a string that needs no unescaping: valid UTF-8, no control
// characters, no backslash.
func (p *canonParser) str(dst *string) bool {
	if len(p.b) == 0 || p.b[0] != '"' {
		return false
	}
	end := bytes.IndexByte(p.b[1:], '"')
	if end < 0 {
		return false
	}
	s := p.b[1 : 1+end]
	for _, c := range s {
		if c < 0x20 || c == '\\' {
			return false
		}
	}
	if !utf8.Valid(s) {
		return false
	}
	*dst = string(s)
	p.b = p.b[end+2:]
	return true
}

// digits returns the run of ASCII digits at the start, without a leading
// zero unless it is "0".
func (p *canonParser) digits() ([]byte, bool) {
	n := 0
	for n < len(p.b) && p.b[n] >= '0' && p.b[n] <= '9' {
		n++
	}
	if n == 0 || (n > 1 && p.b[0] == '0') || n > 19 {
		return nil, false
	}
	d := p.b[:n]
	p.b = p.b[n:]
	return d, true
}

func (p *canonParser) uint(dst *uint64) bool {
	d, ok := p.digits()
	if !ok {
		return false
	}
	v, err := strconv.ParseUint(string(d), 10, 64)
	*dst = v
	return err == nil
}

func (p *canonParser) int(dst *int) bool {
	d, ok := p.digits()
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(string(d), 10, 0)
	*dst = int(v)
	return err == nil
}

func (p *canonParser) time(dst *time.Time) bool {
	if len(p.b) == 0 || p.b[0] != '"' {
		return false
	}
	end := bytes.IndexByte(p.b[1:], '"')
	if end < 0 {
		return false
	}
	if err := dst.UnmarshalJSON(p.b[:end+2]); err != nil {
		return false
	}
	p.b = p.b[end+2:]
	return true
}

// payload takes the JSON value that runs to the closing brace of the
// envelope or to a following checkpoint_ref. Whether it is valid JSON is
// left to validateStored: if it is not, neither is the envelope.
func (p *canonParser) payload(dst *json.RawMessage) bool {
	n := valueEnd(p.b)
	if n <= 0 {
		return false
	}
	*dst = append(json.RawMessage(nil), p.b[:n]...)
	p.b = p.b[n:]
	return true
}

// valueEnd returns the length of the JSON value at the start of b, assuming
// it is valid (validateStored checks afterwards), or -1.
func valueEnd(b []byte) int {
	depth, inStr := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inStr:
			if c == '\\' {
				i++
			} else if c == '"' {
				inStr = false
				if depth == 0 {
					return i + 1
				}
			}
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				return i // a scalar ended at the envelope's closing brace
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case c == ',' && depth == 0:
			return i
		}
	}
	return -1
}
