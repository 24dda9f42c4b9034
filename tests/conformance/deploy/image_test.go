package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"path"
	"strings"
	"testing"
)

// entry is one file of an image layer.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	link     string
	data     []byte
}

// checkImage checks what `cargo xtask image` promises of the OCI archive at archive, built from
// binary for version: the name, the configuration (its own unprivileged user, the entrypoint,
// the OCI labels), and one layer holding the binary, every library its ELF headers name and the
// loader they name (read here with Go's ELF reader, not with the ldd the builder used), the TLS
// roots, the users, and the copyright file and dpkg record of every package the label lists;
// owned by root, readable by all, and nothing outside the directories an image like it has.
func checkImage(t *testing.T, archive, binary, version string) {
	t.Helper()
	files := map[string][]byte{}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := tar.NewReader(f)
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
	blob := func(digest string) []byte {
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
		if !ok {
			t.Fatalf("%s: no blob %s", archive, digest)
		}
		return b
	}
	decode := func(b []byte, v any) {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
	}

	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	decode(files["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json lists %d images, want 1", len(index.Manifests))
	}
	if name := index.Manifests[0].Annotations["io.containerd.image.name"]; name != "ghcr.io/resmgr/resmgr:"+version {
		t.Errorf("the archive names the image %q, want ghcr.io/resmgr/resmgr:%s", name, version)
	}
	var manifest struct {
		Config      struct{ Digest string } `json:"config"`
		Layers      []struct{ Digest, MediaType string }
		Annotations map[string]string `json:"annotations"`
	}
	decode(blob(index.Manifests[0].Digest), &manifest)
	var config struct {
		Config struct {
			User       string
			Entrypoint []string
			Labels     map[string]string
		} `json:"config"`
	}
	decode(blob(manifest.Config.Digest), &config)
	c := config.Config
	if c.User != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532", c.User)
	}
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/local/bin/resmgr" {
		t.Errorf("entrypoint %v", c.Entrypoint)
	}
	for _, labels := range []map[string]string{c.Labels, manifest.Annotations} {
		if labels["org.opencontainers.image.version"] != version || labels["org.opencontainers.image.title"] != "resmgr" ||
			labels["org.opencontainers.image.licenses"] == "" || labels["org.opencontainers.image.source"] == "" {
			t.Errorf("OCI labels or annotations missing: %v", labels)
		}
	}

	if len(manifest.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(manifest.Layers))
	}
	var layer io.Reader = bytes.NewReader(blob(manifest.Layers[0].Digest))
	if strings.HasSuffix(manifest.Layers[0].MediaType, "+gzip") {
		if layer, err = gzip.NewReader(layer); err != nil {
			t.Fatal(err)
		}
	}
	entries := map[string]entry{}
	lr := tar.NewReader(layer)
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(lr)
		name := strings.TrimSuffix(h.Name, "/")
		entries[name] = entry{h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname, b}
		top := strings.Split(name, "/")[0]
		switch top {
		case "bin", "lib", "lib64", "usr", "etc", "tmp", "var":
		default:
			t.Errorf("the layer holds %s, outside the directories of the image", name)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want root", name, h.Uid, h.Gid)
		}
		switch {
		case h.Typeflag == tar.TypeDir && name == "tmp":
			if h.Mode&0o7777 != 0o1777 {
				t.Errorf("tmp has mode %o, want 1777", h.Mode)
			}
		case h.Typeflag == tar.TypeDir:
			if h.Mode&0o7777 != 0o755 {
				t.Errorf("%s has mode %o, want 755", name, h.Mode)
			}
		case h.Typeflag == tar.TypeReg:
			if h.Mode&0o444 != 0o444 {
				t.Errorf("%s (mode %o) is not readable by all", name, h.Mode)
			}
		}
	}
	// A path as the loader resolves it inside the image: symbolic links followed at every step,
	// an absolute target from the image's root.
	var resolveFrom func(p string, depth int) (string, bool)
	resolveFrom = func(p string, depth int) (string, bool) {
		if depth > 40 {
			return p, false
		}
		cur := ""
		for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
			switch part {
			case "", ".":
				continue
			case "..":
				cur = strings.TrimPrefix(path.Dir(cur), ".")
				continue
			}
			next := path.Join(cur, part)
			e, ok := entries[next]
			if !ok {
				return next, false
			}
			if e.typ != tar.TypeSymlink {
				cur = next
				continue
			}
			target := e.link
			if !strings.HasPrefix(target, "/") {
				target = path.Join(cur, target)
			}
			if cur, ok = resolveFrom(target, depth+1); !ok {
				return cur, false
			}
		}
		e, ok := entries[cur]
		return cur, ok && (e.typ == tar.TypeReg || e.typ == tar.TypeDir)
	}
	resolve := func(p string) (string, bool) { return resolveFrom(p, 0) }

	want, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if got := entries["usr/local/bin/resmgr"]; !bytes.Equal(got.data, want) || got.mode&0o755 != 0o755 {
		t.Errorf("/usr/local/bin/resmgr is not the binary given, executable by all")
	}
	exe, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	for _, prog := range exe.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		interp, _ := io.ReadAll(prog.Open())
		loader := strings.TrimRight(string(interp), "\x00")
		if _, ok := resolve(loader); !ok {
			t.Errorf("the binary's loader %s is not in the image", loader)
		}
	}
	// Every library the binary needs, and every library those need, found where the loader looks.
	needed, err := exe.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(needed) == 0 {
		t.Fatalf("%s names no libraries: not the dynamic binary the image is for", binary)
	}
	seen := map[string]bool{}
	for len(needed) > 0 {
		soname := needed[0]
		needed = needed[1:]
		if seen[soname] {
			continue
		}
		seen[soname] = true
		found := ""
		for _, dir := range []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "usr/lib64"} {
			if p, ok := resolve(dir + "/" + soname); ok && found == "" {
				found = p
			}
		}
		if found == "" {
			t.Errorf("%s is needed, and not in the image", soname)
			continue
		}
		lib, err := elf.NewFile(bytes.NewReader(entries[found].data))
		if err != nil {
			t.Errorf("%s (%s) is not an ELF library: %v", soname, found, err)
			continue
		}
		more, err := lib.ImportedLibraries()
		if err != nil {
			t.Errorf("%s: %v", found, err)
		}
		needed = append(needed, more...)
	}
	for _, lib := range []string{"libhwloc.so.15", "libudev.so.1", "libc.so.6"} {
		if !seen[lib] {
			t.Errorf("the walk of the binary's libraries never met %s: %v", lib, seen)
		}
	}

	if p, ok := resolve("etc/ssl/certs/ca-certificates.crt"); !ok || strings.Count(string(entries[p].data), "BEGIN CERTIFICATE") < 100 {
		t.Errorf("the image has no CA bundle at /etc/ssl/certs/ca-certificates.crt")
	}
	if !strings.Contains(string(entries["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user 65532: %q", entries["etc/passwd"].data)
	}
	packages := strings.Fields(c.Labels["io.resmgr.image.debian-packages"])
	if len(packages) < 2 {
		t.Errorf("the image lists its Debian packages as %v", packages)
	}
	for _, p := range packages {
		nameArch, version, _ := strings.Cut(p, "=")
		name, _, _ := strings.Cut(nameArch, ":")
		if record := string(entries["var/lib/dpkg/status.d/"+name].data); !strings.Contains(record, "\nVersion: "+version+"\n") {
			t.Errorf("%s: no dpkg record of version %s in /var/lib/dpkg/status.d: %q", name, version, record)
		}
		if _, ok := resolve("usr/share/doc/" + name + "/copyright"); !ok {
			t.Errorf("%s: no copyright file in the image", name)
		}
	}
}
