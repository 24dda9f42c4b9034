//! A small OCI image builder: layers from directory trees, an image configuration, and an
//! OCI image-layout archive (`.tar`) that `ctr images import`, `skopeo copy oci-archive:…`,
//! `crane push` and `docker load` accept, built without a container engine or a registry.
//!
//! The archive is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) that also
//! carries a Docker-style `manifest.json`, as containerd's own exporter writes, so tools that
//! only know `docker save` archives read it too. Its index names the image both ways runtimes
//! look for a name: `io.containerd.image.name` (the full reference, which `ctr images import`
//! uses) and `org.opencontainers.image.ref.name` (the tag, which `skopeo` and `crane` use).
//!
//! Everything is reproducible: entries are sorted, owned by root, dated at the epoch (or
//! `SOURCE_DATE_EPOCH`), and gzip headers carry no time, so the same tree gives the same
//! digests. Callers can then skip an import when the runtime already holds the digest.
//!
//! Written here rather than taken from a crate: the OCI image crates model the specification's
//! types but build no layers, and the whole builder is a few hundred lines over `tar`, `flate2`
//! and `sha2`, which xtask already uses for the chart package and the release checksums.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// OCI media types the builder writes.
pub mod media_type {
    /// An image index (`index.json`).
    pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// An image manifest.
    pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// An image configuration.
    pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    /// An uncompressed layer.
    pub const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    /// A gzip-compressed layer.
    pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
}

/// The annotation containerd reads an imported image's name from.
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI annotation for an image's reference (its tag) in a layout.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What went wrong building an image, naming the file or the value.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("{path}: {what} cannot go into an image layer (only files, directories and symlinks)")]
    Unsupported { path: PathBuf, what: &'static str },
    #[error("{path}: a layer path must be valid UTF-8")]
    NotUtf8 { path: PathBuf },
    #[error("image name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
}

/// How a layer's tar stream is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Plain tar: the layer's digest is its diff ID.
    None,
    /// gzip, as registries store layers.
    #[default]
    Gzip,
}

/// A sha256 digest, `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(format!("sha256:{:x}", Sha256::digest(bytes)))
    }

    /// The hex part, the blob's file name under `blobs/sha256/`.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A blob with its digest and media type.
#[derive(Debug, Clone)]
struct Blob {
    media_type: &'static str,
    digest: Digest,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, bytes: Vec<u8>) -> Self {
        Self {
            media_type,
            digest: Digest::of(&bytes),
            bytes,
        }
    }

    fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest.to_string(), "size": self.bytes.len()})
    }
}

/// One layer: a tar stream of a directory tree, maybe compressed.
#[derive(Debug, Clone)]
pub struct Layer {
    blob: Blob,
    diff_id: Digest,
    /// What the layer holds, for the configuration's history.
    created_by: String,
}

impl Layer {
    /// A layer holding the tree under `dir`, as `/` of the image: its directories, regular
    /// files (hard links kept as links), and symbolic links (kept as they are, not followed),
    /// with their permission bits; owner root, dated at [`epoch`]. Device nodes, sockets and
    /// fifos are refused.
    pub fn from_dir(dir: &Path, compression: Compression) -> Result<Self, OciError> {
        let tar = tar_of_dir(dir)?;
        let diff_id = Digest::of(&tar);
        let blob = match compression {
            Compression::None => Blob::new(media_type::LAYER, tar),
            Compression::Gzip => {
                // No name and no time in the gzip header: the same tree, the same digest.
                let mut gz = flate2::GzBuilder::new()
                    .mtime(0)
                    .write(Vec::new(), flate2::Compression::default());
                gz.write_all(&tar).map_err(|source| OciError::Write {
                    path: dir.to_owned(),
                    source,
                })?;
                let bytes = gz.finish().map_err(|source| OciError::Write {
                    path: dir.to_owned(),
                    source,
                })?;
                Blob::new(media_type::LAYER_GZIP, bytes)
            }
        };
        Ok(Self {
            blob,
            diff_id,
            // Not the directory's path: a temporary directory's name would change the digest.
            created_by: "a directory tree".to_owned(),
        })
    }

    /// The layer with `created_by` as its history entry (what it holds).
    pub fn described(mut self, created_by: &str) -> Self {
        created_by.clone_into(&mut self.created_by);
        self
    }

    /// The digest of the uncompressed tar stream (what the configuration lists).
    pub fn diff_id(&self) -> &Digest {
        &self.diff_id
    }

    /// The digest of the stored blob (what the manifest lists).
    pub fn digest(&self) -> &Digest {
        &self.blob.digest
    }
}

/// The time every entry and the configuration carry: `SOURCE_DATE_EPOCH` when set (the
/// reproducible-builds convention), else 0.
pub fn epoch() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Every path under `dir` (relative, sorted so parents come before children).
fn walk(dir: &Path) -> Result<Vec<PathBuf>, OciError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let full = dir.join(&rel);
        let entries = fs::read_dir(&full).map_err(|source| OciError::Read {
            path: full.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| OciError::Read {
                path: full.clone(),
                source,
            })?;
            let child = rel.join(entry.file_name());
            let is_dir = entry
                .file_type()
                .map_err(|source| OciError::Read {
                    path: dir.join(&child),
                    source,
                })?
                .is_dir();
            if is_dir {
                stack.push(child.clone());
            }
            out.push(child);
        }
    }
    out.sort();
    Ok(out)
}

fn tar_of_dir(dir: &Path) -> Result<Vec<u8>, OciError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    let mtime = epoch();
    let mut builder = tar::Builder::new(Vec::new());
    // (device, inode) of regular files with several links -> the first path written.
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let write_err = |path: &Path| {
        let path = dir.join(path);
        move |source| OciError::Write { path, source }
    };
    for rel in walk(dir)? {
        let full = dir.join(&rel);
        if rel.to_str().is_none() {
            return Err(OciError::NotUtf8 { path: full });
        }
        let meta = fs::symlink_metadata(&full).map_err(|source| OciError::Read {
            path: full.clone(),
            source,
        })?;
        let kind = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.permissions().mode() & 0o7777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder
                .append_data(&mut header, &rel, io::empty())
                .map_err(write_err(&rel))?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&full).map_err(|source| OciError::Read {
                path: full.clone(),
                source,
            })?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder
                .append_link(&mut header, &rel, &target)
                .map_err(write_err(&rel))?;
        } else if kind.is_file() {
            if meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = linked.get(&key) {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    builder
                        .append_link(&mut header, &rel, first)
                        .map_err(write_err(&rel))?;
                    continue;
                }
                linked.insert(key, rel.clone());
            }
            let file = fs::File::open(&full).map_err(|source| OciError::Read {
                path: full.clone(),
                source,
            })?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            builder
                .append_data(&mut header, &rel, file)
                .map_err(write_err(&rel))?;
        } else {
            use std::os::unix::fs::FileTypeExt as _;
            let what = if kind.is_block_device() || kind.is_char_device() {
                "a device node"
            } else if kind.is_fifo() {
                "a fifo"
            } else {
                "a socket"
            };
            return Err(OciError::Unsupported { path: full, what });
        }
    }
    builder.into_inner().map_err(write_err(Path::new("")))
}

/// The image configuration's `config` (what a runtime runs) and platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `NAME=value` entries.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// OCI architecture name (`amd64`, `arm64`): see [`host_architecture`].
    pub architecture: String,
    pub os: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            working_dir: None,
            user: None,
            labels: BTreeMap::new(),
            architecture: host_architecture().to_owned(),
            os: "linux".into(),
        }
    }
}

/// This machine's architecture as OCI names it (Go's GOARCH names).
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// An image to write: a name, a configuration and layers (bottom first).
#[derive(Debug, Clone)]
pub struct Image {
    /// The full reference, `registry/repository:tag` (`localhost/resmgr-e2e:1`).
    pub name: String,
    pub config: Config,
    pub layers: Vec<Layer>,
    /// Annotations of the manifest (`org.opencontainers.image.source`, …).
    pub annotations: BTreeMap<String, String>,
}

/// What [`Image::write_archive`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The manifest's digest: the image's identity in a runtime (`ctr images ls` shows it).
    pub manifest: Digest,
    /// The configuration's digest: the image ID (`crictl images` shows its start).
    pub config: Digest,
}

impl Image {
    /// The tag part of the name (`1` of `localhost/resmgr-e2e:1`), checked.
    fn tag(&self) -> Result<&str, OciError> {
        let bad = |why| OciError::BadName {
            name: self.name.clone(),
            why,
        };
        let last = self.name.rsplit('/').next().unwrap_or("");
        let (repo, tag) = last
            .split_once(':')
            .ok_or_else(|| bad("it has no tag (name:tag)"))?;
        if repo.is_empty() || !self.name.contains('/') {
            return Err(bad(
                "it needs a registry or namespace part (localhost/name:tag)",
            ));
        }
        let valid_tag = !tag.is_empty()
            && tag.len() <= 128
            && tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            && !tag.starts_with(['.', '-']);
        if !valid_tag {
            return Err(bad(
                "its tag must be 1-128 of [A-Za-z0-9_.-], not starting with . or -",
            ));
        }
        let valid_repo = self.name[..self.name.len() - tag.len() - 1]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c));
        if !valid_repo {
            return Err(bad(
                "a repository is lower-case letters, digits and . _ - / (and a registry port)",
            ));
        }
        Ok(tag)
    }

    fn config_blob(&self) -> Blob {
        let c = &self.config;
        let mut config = serde_json::Map::new();
        let mut put = |key: &str, value: Value| {
            config.insert(key.to_owned(), value);
        };
        if !c.entrypoint.is_empty() {
            put("Entrypoint", json!(c.entrypoint));
        }
        if !c.cmd.is_empty() {
            put("Cmd", json!(c.cmd));
        }
        if !c.env.is_empty() {
            put("Env", json!(c.env));
        }
        if let Some(dir) = &c.working_dir {
            put("WorkingDir", json!(dir));
        }
        if let Some(user) = &c.user {
            put("User", json!(user));
        }
        if !c.labels.is_empty() {
            put("Labels", json!(c.labels));
        }
        let created = rfc3339(epoch());
        let bytes = serde_json::to_vec(&json!({
            "created": created,
            "architecture": c.architecture,
            "os": c.os,
            "config": config,
            "rootfs": {
                "type": "layers",
                "diff_ids": self.layers.iter().map(|l| l.diff_id.to_string()).collect::<Vec<_>>(),
            },
            "history": self.layers.iter().map(|l| json!({"created": created, "created_by": l.created_by})).collect::<Vec<_>>(),
        }))
        .expect("a JSON value serializes");
        Blob::new(media_type::CONFIG, bytes)
    }

    /// Writes the image as an OCI image-layout archive at `path` (atomically: a temporary
    /// file next to it, renamed into place).
    pub fn write_archive(&self, path: &Path) -> Result<Written, OciError> {
        let tag = self.tag()?;
        let config = self.config_blob();
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": media_type::MANIFEST,
            "config": config.descriptor(),
            "layers": self.layers.iter().map(|l| l.blob.descriptor()).collect::<Vec<_>>(),
        });
        if !self.annotations.is_empty() {
            manifest["annotations"] = json!(self.annotations);
        }
        let manifest = Blob::new(
            media_type::MANIFEST,
            serde_json::to_vec(&manifest).expect("a JSON value serializes"),
        );
        let mut descriptor = manifest.descriptor();
        descriptor["annotations"] = json!({CONTAINERD_NAME: self.name, REF_NAME: tag});
        descriptor["platform"] =
            json!({"architecture": self.config.architecture, "os": self.config.os});
        let index = json!({
            "schemaVersion": 2,
            "mediaType": media_type::INDEX,
            "manifests": [descriptor],
        });
        let blob_path = |b: &Blob| format!("blobs/sha256/{}", b.digest.hex());
        let docker = json!([{
            "Config": blob_path(&config),
            "RepoTags": [self.name],
            "Layers": self.layers.iter().map(|l| blob_path(&l.blob)).collect::<Vec<_>>(),
        }]);

        let mut files: Vec<(String, Vec<u8>)> = vec![
            (
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            (
                "index.json".into(),
                serde_json::to_vec(&index).expect("a JSON value serializes"),
            ),
            (
                "manifest.json".into(),
                serde_json::to_vec(&docker).expect("a JSON value serializes"),
            ),
        ];
        let mut blobs: Vec<&Blob> = vec![&config, &manifest];
        blobs.extend(self.layers.iter().map(|l| &l.blob));
        blobs.sort_by(|a, b| a.digest.cmp(&b.digest));
        blobs.dedup_by(|a, b| a.digest == b.digest);

        let write_err = |source| OciError::Write {
            path: path.to_owned(),
            source,
        };
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(write_err)?;
        let tmp = tempfile::NamedTempFile::new_in(dir).map_err(write_err)?;
        let mut builder = tar::Builder::new(io::BufWriter::new(tmp));
        let mtime = epoch();
        let mut append = |name: &str, bytes: &[u8], directory: bool| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(if directory {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            });
            header.set_mode(if directory { 0o755 } else { 0o644 });
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(mtime);
            header.set_size(bytes.len() as u64);
            builder.append_data(&mut header, name, bytes)
        };
        append("blobs", &[], true).map_err(write_err)?;
        append("blobs/sha256", &[], true).map_err(write_err)?;
        for blob in &blobs {
            append(&blob_path(blob), &blob.bytes, false).map_err(write_err)?;
        }
        for (name, bytes) in &mut files {
            bytes.push(b'\n');
            append(name, bytes, false).map_err(write_err)?;
        }
        let tmp = builder
            .into_inner()
            .map_err(write_err)?
            .into_inner()
            .map_err(|e| write_err(e.into_error()))?;
        // Readable by all, as any other build output (a temporary file starts 0600).
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(write_err)?;
        tmp.as_file().sync_all().map_err(write_err)?;
        tmp.persist(path).map_err(|e| write_err(e.error))?;
        Ok(Written {
            manifest: manifest.digest.clone(),
            config: config.digest.clone(),
        })
    }
}

/// `seconds` since the epoch as an RFC 3339 UTC time (`1970-01-01T00:00:00Z`).
fn rfc3339(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rem = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(i64::MAX / 2) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::{io::Read as _, os::unix::fs::PermissionsExt as _};

    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("etc/empty")).unwrap();
        fs::write(root.join("bin/busybox"), b"#!not really\n").unwrap();
        fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
        fs::hard_link(root.join("bin/busybox"), root.join("bin/sleep")).unwrap();
        fs::write(root.join("etc/hostname"), b"e2e\n").unwrap();
        dir
    }

    /// (path, kind, mode, size, link target) of every entry of a tar stream.
    fn entries(tar: &[u8]) -> Vec<(String, char, u32, u64, String)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                let kind = match h.entry_type() {
                    tar::EntryType::Directory => 'd',
                    tar::EntryType::Symlink => 's',
                    tar::EntryType::Link => 'h',
                    tar::EntryType::Regular => 'f',
                    _ => '?',
                };
                assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
                assert_eq!(h.mtime().unwrap(), 0);
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                (
                    e.path().unwrap().display().to_string(),
                    kind,
                    h.mode().unwrap(),
                    h.size().unwrap(),
                    link,
                )
            })
            .collect()
    }

    #[test]
    fn a_layer_holds_the_tree_sorted_owned_by_root_with_links_kept() {
        let dir = tree();
        let layer = Layer::from_dir(dir.path(), Compression::None).unwrap();
        assert_eq!(layer.digest(), layer.diff_id(), "uncompressed: one digest");
        let got = entries(&layer.blob.bytes);
        let want = [
            ("bin", 'd'),
            ("bin/busybox", 'f'),
            ("bin/sh", 's'),
            ("bin/sleep", 'h'),
            ("etc", 'd'),
            ("etc/empty", 'd'),
            ("etc/hostname", 'f'),
        ];
        let names: Vec<(&str, char)> = got.iter().map(|e| (e.0.as_str(), e.1)).collect();
        assert_eq!(names, want);
        assert_eq!(got[1].2 & 0o777, 0o755);
        assert_eq!(got[1].3, 13);
        assert_eq!(got[2].4, "busybox", "a symlink keeps its target");
        assert_eq!(got[3].4, "bin/busybox", "a hard link names the first path");
        assert_eq!(got[3].3, 0, "a hard link carries no second copy");
    }

    #[test]
    fn the_same_tree_gives_the_same_digests_and_gzip_decodes_to_the_diff_id() {
        let dir = tree();
        let a = Layer::from_dir(dir.path(), Compression::Gzip).unwrap();
        let b = Layer::from_dir(dir.path(), Compression::Gzip).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), a.diff_id());
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&a.blob.bytes[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(&Digest::of(&plain), a.diff_id());
        assert_eq!(a.blob.media_type, media_type::LAYER_GZIP);
    }

    #[test]
    fn special_files_are_refused_by_path() {
        let dir = tree();
        let fifo = dir.path().join("etc/fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let err = Layer::from_dir(dir.path(), Compression::None).unwrap_err();
        assert!(
            matches!(&err, OciError::Unsupported { path, what: "a fifo" } if *path == fifo),
            "{err}"
        );
    }

    fn read_archive(path: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(fs::File::open(path).unwrap());
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                (e.path().unwrap().display().to_string(), bytes)
            })
            .collect()
    }

    fn image(dir: &Path) -> Image {
        let mut config = Config {
            entrypoint: vec!["/bin/sleep".into()],
            cmd: vec!["2147483647".into()],
            ..Config::default()
        };
        config.labels.insert("io.resmgr.test".into(), "yes".into());
        Image {
            name: "localhost/resmgr-e2e:1".into(),
            config,
            layers: vec![Layer::from_dir(dir, Compression::Gzip).unwrap()],
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn the_archive_is_an_oci_layout_whose_digests_and_names_hold() {
        let dir = tree();
        let out = tempfile::tempdir().unwrap();
        let path = out.path().join("image.tar");
        let image = image(dir.path());
        let written = image.write_archive(&path).unwrap();
        let files = read_archive(&path);
        let json = |name: &str| -> Value { serde_json::from_slice(&files[name]).unwrap() };
        assert_eq!(json("oci-layout"), json!({"imageLayoutVersion": "1.0.0"}));

        // Every blob is stored under its own digest.
        for (name, bytes) in &files {
            if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                assert_eq!(Digest::of(bytes).hex(), hex, "{name}");
            }
        }
        let index = json("index.json");
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], written.manifest.to_string());
        assert_eq!(m["mediaType"], media_type::MANIFEST);
        assert_eq!(m["annotations"][CONTAINERD_NAME], "localhost/resmgr-e2e:1");
        assert_eq!(m["annotations"][REF_NAME], "1");
        let manifest = json(&format!("blobs/sha256/{}", written.manifest.hex()));
        assert_eq!(
            m["size"],
            files[&format!("blobs/sha256/{}", written.manifest.hex())].len()
        );
        assert_eq!(manifest["config"]["digest"], written.config.to_string());
        let layer = &image.layers[0];
        assert_eq!(manifest["layers"][0]["digest"], layer.digest().to_string());
        assert_eq!(manifest["layers"][0]["mediaType"], media_type::LAYER_GZIP);

        let config = json(&format!("blobs/sha256/{}", written.config.hex()));
        assert_eq!(config["rootfs"]["diff_ids"][0], layer.diff_id().to_string());
        assert_eq!(config["config"]["Entrypoint"], json!(["/bin/sleep"]));
        assert_eq!(config["config"]["Labels"]["io.resmgr.test"], "yes");
        assert_eq!(config["architecture"], host_architecture());
        assert_eq!(config["created"], "1970-01-01T00:00:00Z");

        // The docker-save view of the same blobs.
        let docker = json("manifest.json");
        assert_eq!(docker[0]["RepoTags"], json!(["localhost/resmgr-e2e:1"]));
        assert_eq!(
            docker[0]["Config"],
            format!("blobs/sha256/{}", written.config.hex())
        );

        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644,
            "readable by all"
        );
        assert_eq!(config["history"][0]["created_by"], "a directory tree");

        // Written again: byte for byte the same.
        let again = out.path().join("again.tar");
        assert_eq!(image.write_archive(&again).unwrap(), written);
        assert_eq!(fs::read(&path).unwrap(), fs::read(&again).unwrap());
    }

    #[test]
    fn names_without_a_tag_or_a_namespace_are_refused() {
        let dir = tree();
        let mut image = image(dir.path());
        let out = tempfile::tempdir().unwrap();
        for (name, why) in [
            ("localhost/resmgr-e2e", "no tag"),
            ("resmgr-e2e:1", "registry or namespace"),
            ("localhost/Resmgr:1", "lower-case"),
            ("localhost/resmgr:-1", "its tag"),
        ] {
            image.name = name.into();
            let err = image
                .write_archive(&out.path().join("x.tar"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(name) && err.contains(why), "{name}: {err}");
        }
        assert!(!out.path().join("x.tar").exists());
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
