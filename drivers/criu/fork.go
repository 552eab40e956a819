package criu

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit"
	"github.com/checkpoint-restore/go-criu/v8/crit/images/userns"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// A fork is a restore of an image into a sandbox id other than the one it
// was cut from (the engine's RestoreRequest.AsNew, or the recover of a
// fork from its origin's checkpoint). It gets a uid range of its own — the
// original may be running in the image's range — so the host ids the
// image holds are moved to the new range. What in an image holds host ids
// (found by decoding, with go-criu's crit, every image of a dumped
// sandbox, and looking for ids of its range; TestForkWhileOriginalRuns
// checks the outcome):
//
//   - userns-*.img (UsernsEntry): the uid_map and gid_map extents' lower_first
//     are host ids, the range the sandbox had. CRIU writes them into the
//     restored user namespace's maps as they are. Rewritten here.
//   - image.json's host_id, and layer.tar, whose owners are relative to
//     it: the new range is the record's, and the layer is extracted with
//     owners shifted into it (archiveOptions).
//
// Every other id is relative to the sandbox's user namespace: CRIU
// translates host ids into it when it dumps a task of a user namespace
// (the creds of core-*.img: a process running as nobody holds 65534; the
// fown of files.img), and it archives tmpfs mounts (tmpfs-dev-*.tar.gz.img)
// from inside the namespace, with in-namespace owners. The images that
// are not protobuf (ifaddr, route, rule, iptables, nftables: the
// sandbox's own network namespace) held none. The network, pid, ipc, uts,
// mount and time namespaces are restored fresh for the fork; its cgroup,
// root and state directory are its own (libcontainer's restore maps them
// to the new id's).
//
// The image is never changed in place (it is the checkpoint's, hot-tier
// data another restore may read): the fork restores from a private copy
// under its record directory, cloned where the filesystem can (FICLONE),
// copied where not, removed once CRIU is done with it.

// claimForRestore makes rec's record directory, claims its uid range —
// the image's (rec.Slot) or, for a fork, the lowest free one, which
// becomes rec's — and saves rec. On failure nothing of it is left.
func (d *Driver) claimForRestore(rec *record, forked bool) error {
	if err := os.Mkdir(d.recordDir(rec.ID), 0o711); err != nil {
		return err
	}
	var err error
	if forked {
		var slot int
		if slot, err = d.claimSlot(rec.ID); err == nil {
			rec.Slot, rec.HostID = slot, d.opts.UIDBase+slot*idsPerSandbox
		}
	} else {
		err = d.claimSlotN(rec.ID, rec.Slot)
	}
	if err == nil {
		if err = d.saveRecord(rec); err != nil {
			_ = d.releaseSlot(rec.ID, rec.Slot)
		}
	}
	if err != nil {
		_ = os.RemoveAll(d.recordDir(rec.ID))
	}
	return err
}

// criuImagesFor returns the image directory to restore rec from and its
// CRIU directory, made readable by the restored tasks (prepareImages):
// imageDir's own for a restore under the image's id; for a fork, a
// private copy (forkImageDir) with the user namespace maps moved from the
// image's range (oldHost) to rec's.
func (d *Driver) criuImagesFor(rec *record, imageDir string, oldHost int, forked bool) (string, string, error) {
	images, criuDir := imageDir, filepath.Join(imageDir, imageCriuDir)
	if forked {
		images = d.forkImageDir(rec.ID)
		criuDir = filepath.Join(images, imageCriuDir)
		if err := copyImagesRemapped(filepath.Join(imageDir, imageCriuDir), criuDir, oldHost, rec.HostID); err != nil {
			return "", "", err
		}
	}
	// Restored tasks read the images from inside the user namespace.
	if err := prepareImages(images, criuDir, rec.HostID); err != nil {
		return "", "", err
	}
	return images, criuDir, nil
}

// forkImageDir is where a fork's private copy of the image lives.
func (d *Driver) forkImageDir(id string) string {
	return filepath.Join(d.recordDir(id), "fork-image")
}

// copyImagesRemapped copies the CRIU images in src to dst (created, 0700),
// rewriting the user namespace maps of every userns-*.img from the host
// range oldHost..oldHost+idsPerSandbox-1 to the one starting at newHost.
// An extent outside the old range is DataLoss: the driver never maps
// other host ids into a sandbox.
func copyImagesRemapped(src, dst string, oldHost, newHost int) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	remapped := 0
	err := filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case de.IsDir():
			if rel == "." {
				return nil
			}
			return os.Mkdir(out, 0o700)
		case !de.Type().IsRegular():
			return errdefs.DataLossf("checkpoint image: %s is not a regular file", rel)
		case strings.HasPrefix(de.Name(), "userns-") && strings.HasSuffix(de.Name(), ".img"):
			remapped++
			return remapUserns(p, out, oldHost, newHost)
		default:
			return cloneFile(p, out)
		}
	})
	if err != nil {
		return fmt.Errorf("copy images for a fork: %w", err)
	}
	if remapped == 0 {
		return errdefs.DataLossf("checkpoint image: no userns image in %s (a criu driver image has one)", src)
	}
	return nil
}

// remapUserns writes to dst the user namespace image src with its
// extents moved from the range at oldHost to the one at newHost.
func remapUserns(src, dst string, oldHost, newHost int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	img, err := crit.New(in, nil, "", false, false).Decode(&userns.UsernsEntry{})
	if err != nil {
		return errdefs.DataLossf("checkpoint image %s: %v", filepath.Base(src), err)
	}
	move := func(exts []*userns.UidGidExtent) error {
		for _, x := range exts {
			lo := int(x.GetLowerFirst())
			if lo < oldHost || lo+int(x.GetCount()) > oldHost+idsPerSandbox {
				return errdefs.DataLossf("checkpoint image %s: extent %d..%d (host %d, %d ids) outside the image's uid range %d..%d", filepath.Base(src), x.GetFirst(), x.GetFirst()+x.GetCount()-1, lo, x.GetCount(), oldHost, oldHost+idsPerSandbox-1)
			}
			nl := uint32(lo - oldHost + newHost)
			x.LowerFirst = &nl
		}
		return nil
	}
	for _, e := range img.Entries {
		ue, ok := e.Message.(*userns.UsernsEntry)
		if !ok {
			return errdefs.DataLossf("checkpoint image %s: entry of type %T", filepath.Base(src), e.Message)
		}
		if err := move(ue.UidMap); err != nil {
			return err
		}
		if err := move(ue.GidMap); err != nil {
			return err
		}
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := crit.New(nil, out, "", false, false).Encode(img); err != nil {
		out.Close()
		return fmt.Errorf("encode %s: %w", filepath.Base(dst), err)
	}
	return out.Close()
}

// cloneFile copies src to a new file dst: a reflink (FICLONE) where the
// filesystem shares extents, else an in-kernel copy (io.Copy between two
// files uses copy_file_range).
func cloneFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// A failed clone leaves dst empty; any reason (EOPNOTSUPP, EXDEV,
	// ENOTTY on filesystems without reflinks) falls back to the copy.
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s: %w", filepath.Base(src), err)
		}
	}
	return out.Close()
}
