// Package lib holds leaf helpers any part of Amber may use: network
// namespaces (lib/netns), failpoints (lib/failpoint), small net/http helpers
// (lib/httpx), file modes from stat(2) (lib/statmode). A leaf knows nothing
// of Amber's domain.
//
// May import: core.
package lib
