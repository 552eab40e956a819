package main

// buildTags are the build tags the e2e tests build amber with: the same as
// this test binary's (see tags_seccomp_test.go).
var buildTags string
