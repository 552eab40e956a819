package engine

// Reserved labels.
//
// Metadata keys beginning ReservedLabelPrefix ("amber.") are Amber's own
// labels. The session harness labels each sandbox it makes
// amber.session=<id> and amber.session.sandbox=<n>, and a Wake takes a
// running sandbox so labeled as one an earlier attempt of its own made
// (internal/session newsandbox.go). A caller that could set them could
// have a sandbox of its own — any files, any processes — adopted by a
// session as if the harness had made it fresh, or pass a sandbox off as
// one of Amber's. So a create refuses them (InvalidArgument, naming the
// key) unless the request is Amber's own (CreateRequest.ReservedLabels,
// which no edge sets: the REST API, E2B's control plane and MCP's
// sandbox_create all pass a caller's metadata as it came). Reading them
// is open: a tenant lists and filters its sandboxes by any key (Find).
//
// Amber's lookups match keys byte for byte, so only a key beginning with
// exactly "amber." could be taken for one of its own. The refusal is
// wider, to keep keys a person would read as Amber's out of the rows too:
// any case ("Amber.Session"), invisible characters anywhere before the
// dot (spaces, controls, format characters such as U+200B or U+FEFF), and
// compatibility forms (fullwidth "ａｍｂｅｒ．", folded by NFKC). A key
// that only resembles it in another script (a Cyrillic "а") is not
// refused; it is not Amber's either.
//
// Keys beginning "amber/" are another matter: amber/public-ports is a
// switch an owner may set on purpose (PublicPortsKey; E2B's control plane
// refuses the whole "amber/" space from its callers and sets it itself).

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/amber-run/amber/core/errdefs"
)

// ReservedLabelPrefix begins the metadata keys only Amber sets (see the
// file's comment).
const ReservedLabelPrefix = "amber."

// ReservedLabel reports whether metadata key k is, or reads as, one of
// Amber's own labels: it begins with ReservedLabelPrefix in any case,
// once invisible characters are dropped and compatibility forms folded
// (NFKC).
func ReservedLabel(k string) bool {
	if strings.HasPrefix(k, ReservedLabelPrefix) {
		return true
	}
	want := utf8.RuneCountInString(ReservedLabelPrefix)
	head := make([]rune, 0, want)
	for _, r := range norm.NFKC.String(k) {
		if unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if head = append(head, r); len(head) == want {
			break
		}
	}
	return strings.EqualFold(string(head), ReservedLabelPrefix)
}

// checkReservedLabels refuses md's keys that are Amber's own
// (ReservedLabel), naming the key.
func checkReservedLabels(md map[string]string) error {
	for k := range md {
		if ReservedLabel(k) {
			return errdefs.InvalidArgumentf("metadata key %.60q: keys beginning %q (in any case) are reserved for Amber's own labels", k, ReservedLabelPrefix)
		}
	}
	return nil
}
