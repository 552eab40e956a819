package deploy_test

// The Kubernetes manifests in deploy/kubernetes are checked by kubeconform
// (installed by `make setup-test`: scripts/setup/kubeconform.sh) against
// JSON schemas made here from the Kubernetes API's own OpenAPI document
// (k8s.io/kubernetes api/openapi-spec/swagger.json, from the Go module
// cache): this machine reaches no schema registry. The schemas are strict
// (no property the API does not define), like kubeconform's -strict ones.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// k8sVersion is the Kubernetes API the manifests are validated against
// (keep in step with scripts/setup/kubeconform.sh).
const k8sVersion = "v1.34.0"

func kubeconform(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	for _, p := range []string{filepath.Join(cache, "bin", "kubeconform"), "kubeconform"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatalf("kubeconform not found in %s/bin or on PATH: run `make setup-test` (scripts/setup/kubeconform.sh)", cache)
	return ""
}

// swagger returns the Kubernetes API's OpenAPI v2 document.
func swagger(t *testing.T) map[string]any {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+k8sVersion).Output()
	if err != nil {
		t.Fatalf("go mod download k8s.io/kubernetes@%s: %v (run `make setup-test`)", k8sVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download answered %q: %v", out, err)
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, "api", "openapi-spec", "swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// strict rewrites an OpenAPI v2 schema into the JSON Schema kubeconform
// checks: objects with properties admit no others; IntOrString and
// Quantity take a string or a number, as the API server does.
func strict(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if x["format"] == "int-or-string" {
			return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
		}
		out := map[string]any{}
		for k, e := range x {
			if k == "properties" { // names, not schemas: keep the keys
				props := map[string]any{}
				for name, p := range e.(map[string]any) {
					props[name] = strict(p)
				}
				out[k] = props
				continue
			}
			out[k] = strict(e)
		}
		if _, ok := x["properties"]; ok {
			if _, set := x["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = strict(e)
		}
		return out
	}
	return v
}

// writeSchemas writes one schema per kind of the API into dir, named as
// kubeconform's default location names them: kind-group-version.json
// (group's first label; none for the core group), lower case.
func writeSchemas(t *testing.T, dir string) {
	t.Helper()
	doc := swagger(t)
	defs := doc["definitions"].(map[string]any)
	sdefs := map[string]any{}
	for name, d := range defs {
		sdefs[name] = strict(d)
	}
	sdefs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	n := 0
	for name, d := range defs {
		gvks, _ := d.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			file := strings.ToLower(kind)
			if group != "" {
				file += "-" + strings.ToLower(strings.Split(group, ".")[0])
			}
			file += "-" + strings.ToLower(version) + ".json"
			schema := map[string]any{}
			for k, v := range sdefs[name].(map[string]any) {
				schema[k] = v
			}
			schema["definitions"] = sdefs
			b, err := json.Marshal(schema)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n < 50 {
		t.Fatalf("only %d kinds in the Kubernetes %s API document", n, k8sVersion)
	}
}

type summary struct {
	Resources []struct {
		Filename, Kind, Name, Status, Msg string
	} `json:"resources"`
	Summary struct {
		Valid, Invalid, Errors, Skipped int
	} `json:"summary"`
}

func validate(t *testing.T, bin, schemas string, files ...string) (summary, error) {
	t.Helper()
	args := append([]string{"-strict", "-summary", "-output", "json", "-verbose",
		"-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}{{ .KindSuffix }}.json")}, files...)
	cmd := exec.Command(bin, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	var s summary
	if jerr := json.Unmarshal(out.Bytes(), &s); jerr != nil {
		t.Fatalf("kubeconform output does not decode (%v): %s %s", jerr, out.String(), stderr.String())
	}
	return s, err
}

// TestKubernetesManifests validates every manifest in deploy/kubernetes,
// and checks the check: a copy with a misspelled field, and one with a
// field of the wrong type, must fail.
func TestKubernetesManifests(t *testing.T) {
	bin := kubeconform(t)
	schemas := t.TempDir()
	writeSchemas(t, schemas)
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	s, err := validate(t, bin, schemas, files...)
	for _, r := range s.Resources {
		t.Logf("%s: %s/%s %s %s", r.Filename, r.Kind, r.Name, r.Status, r.Msg)
	}
	if err != nil || s.Summary.Invalid+s.Summary.Errors+s.Summary.Skipped > 0 {
		t.Fatalf("kubeconform: %v; %+v", err, s.Summary)
	}
	kinds := map[string]bool{}
	for _, r := range s.Resources {
		kinds[r.Kind] = true
	}
	for _, k := range []string{"DaemonSet", "Deployment", "Service", "Secret", "PodDisruptionBudget"} {
		if !kinds[k] {
			t.Errorf("no %s among the manifests (%v)", k, kinds)
		}
	}
	t.Logf("%d resources valid against the Kubernetes %s API", s.Summary.Valid, k8sVersion)

	// The validator must be able to say no.
	src, err := os.ReadFile("kubernetes/node-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"misspelled field": strings.Replace(string(src), "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:", 1),
		"wrong type":       strings.Replace(string(src), "privileged: true", "privileged: \"yes\"", 1),
	} {
		if bad == string(src) {
			t.Fatalf("%s: the manifest no longer has what the test changes", name)
		}
		f := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := validate(t, bin, schemas, f)
		if err == nil || s.Summary.Invalid == 0 {
			t.Errorf("%s: kubeconform accepted it (%+v)", name, s.Summary)
		}
	}
}
