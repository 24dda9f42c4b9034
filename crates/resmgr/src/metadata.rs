//! Each prepared claim's device metadata (KEP-5304, [`kube_dra::metadata`]) on the host, and the
//! CDI mounts that show it to the containers using the claim.
//!
//! # What is on disk
//!
//! Under the metadata directory (by default `<kubelet-plugins-dir>/<driver>/dra-device-metadata`,
//! which the agent's pod already mounts at the same path as the host, as CDI needs):
//!
//! | path | what |
//! |---|---|
//! | `<uid>/<request>/metadata.json` | the metadata of claim `<uid>`'s request `<request>` (its base name): the devices allocated to it, each with its attributes and what it was granted |
//! | `<uid>/<request>/.metadata.json.<random>.tmp` | a write in flight, or left by a crash; removed at start-up |
//!
//! The claim's CDI spec mounts each result's request file, read-only, at the path the protocol
//! gives ([`kube_dra::metadata::container_path`]): the mount is in the edits of the result's
//! CDI device, so a container gets the files of exactly the requests it uses, like its CPUs.
//! Results of one request mount the same file at the same path, which the runtimes' CDI code
//! applies once. Directories are named after the claim's UID rather than its name (as Go's
//! helper does), so that a claim deleted and created again under the same name never meets the
//! files of its predecessor.
//!
//! # In the claim's lifecycle
//!
//! A prepare writes the files after its commit and before the CDI spec, each durably
//! ([`cdi::durable`]): the spec is the proof of a completed prepare, and a spec whose mounts
//! name a missing file would fail every container created with it. An unprepare removes them
//! after the spec and before the release. So at every instant a spec's files are on disk, and
//! files on disk belong to a claim the state accounts for, or to a spec (a stray that
//! reconciliation judges); at start-up ([`sweep_at_start`]) the files of any other UID are
//! removed. A claim prepared again rewrites its files only when their content changed, and then
//! with the next `metadata.generation`: a running container's mount keeps the file it was
//! created with (a bind mount follows the inode, which a durable replace swaps), so the content
//! of a claim's files never changes while it is prepared: a claim's grant does not.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
};

use cdi::{ClaimUid, ContainerEdits, Mount};
use kube_dra::metadata::{self as protocol, DeviceMetadata, MetadataVersion, RequestMetadata};
use policy::{AttributeValue, Claim};
use tracing::{info, warn};

/// The name of each request's file in its directory.
pub const FILE_NAME: &str = "metadata.json";
/// Where the files are under the kubelet's plugin directory of the driver.
pub const SUBDIR: &str = "dra-device-metadata";
/// The mode of the files: containers read them as whatever user they run as.
const FILE_MODE: u32 = 0o644;
/// The mode of the directories.
const DIR_MODE: u32 = 0o755;

/// Why device metadata could not be written, removed or listed. Every variant names the claim,
/// the path or the value concerned.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A claim UID that cannot name a directory.
    #[error("refusing claim uid")]
    Uid(#[from] cdi::UidError),
    /// A request name that cannot name a directory (not a DNS label).
    #[error("claim {uid}: request {request:?} cannot name a metadata directory")]
    Request {
        /// The claim.
        uid: String,
        /// The request.
        request: String,
        /// Why.
        #[source]
        source: kubelet_plugin::names::DnsNameError,
    },
    /// The policy's attributes do not fit the claim's results.
    #[error("claim {uid}: the policy described {attributes} results of {results}")]
    Attributes {
        /// The claim.
        uid: String,
        /// Results described.
        attributes: usize,
        /// Results of the claim.
        results: usize,
    },
    /// A file system operation failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl From<cdi::durable::WriteError> for MetadataError {
    fn from(e: cdi::durable::WriteError) -> Self {
        Self::Io {
            op: e.step,
            path: e.path,
            source: e.source,
        }
    }
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> MetadataError {
    MetadataError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// One file of a claim: its request's base name (the directory) and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataFile {
    /// The request's base name.
    pub request: String,
    /// The content, at generation 1 (the store moves it on when it replaces other content).
    pub metadata: RequestMetadata,
}

/// The metadata files of every claim of one driver in one directory. Keeps no state: the
/// directory is the truth. Writes of one claim must not race (the manager's claim locks
/// serialize them).
#[derive(Debug, Clone)]
pub struct MetadataStore {
    dir: PathBuf,
    driver: String,
    versions: Vec<MetadataVersion>,
}

impl MetadataStore {
    /// A store in `dir` for `driver`, writing `versions` (newest first) into each file.
    pub fn new(dir: impl Into<PathBuf>, driver: &str, versions: Vec<MetadataVersion>) -> Self {
        Self {
            dir: dir.into(),
            driver: driver.to_owned(),
            versions,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The versions each file holds.
    pub fn versions(&self) -> &[MetadataVersion] {
        &self.versions
    }

    /// Where the file of claim `uid`'s request `request` (its base name) is.
    pub fn file_path(&self, uid: &ClaimUid, request: &str) -> PathBuf {
        self.dir.join(uid.as_str()).join(request).join(FILE_NAME)
    }

    /// The files of `claim`: one per request it has results of, in the order of its first
    /// result, each listing the request's devices with the policy's `attributes` of each result
    /// (one map per result, or none at all).
    pub fn files(
        &self,
        claim: &Claim,
        attributes: &[BTreeMap<String, AttributeValue>],
    ) -> Result<Vec<MetadataFile>, MetadataError> {
        if !attributes.is_empty() && attributes.len() != claim.results.len() {
            return Err(MetadataError::Attributes {
                uid: claim.uid.clone(),
                attributes: attributes.len(),
                results: claim.results.len(),
            });
        }
        let mut files: Vec<MetadataFile> = Vec::new();
        for (i, result) in claim.results.iter().enumerate() {
            let request = protocol::base_request(&result.request);
            kubelet_plugin::names::dns_label(request).map_err(|source| MetadataError::Request {
                uid: claim.uid.clone(),
                request: result.request.clone(),
                source,
            })?;
            let device = DeviceMetadata {
                driver: self.driver.clone(),
                pool: result.pool.clone(),
                name: result.device.clone(),
                attributes: attributes.get(i).cloned().unwrap_or_default(),
            };
            match files.iter_mut().find(|f| f.request == request) {
                Some(file) => file.metadata.devices.push(device),
                None => files.push(MetadataFile {
                    request: request.to_owned(),
                    metadata: RequestMetadata {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        uid: claim.uid.clone(),
                        generation: 1,
                        pod_claim_name: claim.pod_claim_name.clone(),
                        request: result.request.clone(),
                        devices: vec![device],
                    },
                }),
            }
        }
        Ok(files)
    }

    /// The mount that shows claim `claim`'s file of `request` to a container, read-only, at the
    /// protocol's path.
    pub fn mount(&self, claim: &Claim, request: &str) -> Result<Mount, MetadataError> {
        let uid = ClaimUid::new(&claim.uid)?;
        let base = protocol::base_request(request);
        Ok(Mount {
            host_path: self.file_path(&uid, base).display().to_string(),
            container_path: protocol::container_path(
                &self.driver,
                &claim.name,
                claim.pod_claim_name.as_deref(),
                request,
            ),
            kind: String::new(),
            options: vec!["ro".into(), "bind".into()],
        })
    }

    /// `edits` (one per result of `claim`) with each result's mount added.
    pub fn with_mounts(
        &self,
        claim: &Claim,
        mut edits: Vec<ContainerEdits>,
    ) -> Result<Vec<ContainerEdits>, MetadataError> {
        for (edit, result) in edits.iter_mut().zip(&claim.results) {
            edit.mounts.push(self.mount(claim, &result.request)?);
        }
        Ok(edits)
    }

    /// Writes claim `uid`'s files, each durably; a file whose content is there already is left
    /// as it is, and one whose content changed gets the generation after the one on disk.
    /// When it returns, every file is on disk.
    pub fn write_claim(&self, uid: &str, files: &[MetadataFile]) -> Result<(), MetadataError> {
        let uid = ClaimUid::new(uid)?;
        for file in files {
            let path = self.file_path(&uid, &file.request);
            let dir = path.parent().unwrap_or(&self.dir).to_owned();
            let mut metadata = file.metadata.clone();
            match fs::read(&path) {
                Ok(bytes) => match RequestMetadata::decode(&bytes) {
                    Ok(old) => {
                        metadata.generation = old.generation;
                        if bytes == metadata.encode(&self.versions) {
                            continue;
                        }
                        metadata.generation = old.generation.saturating_add(1);
                    }
                    Err(e) => {
                        warn!(path = %path.display(), error = %stdx::errors::chain(&e), "device metadata on disk does not read back; writing it anew");
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(io_error("reading device metadata", &path, source)),
            }
            cdi::durable::create_dir(&dir, DIR_MODE)?;
            cdi::durable::replace(&dir, FILE_NAME, &metadata.encode(&self.versions), FILE_MODE)?;
        }
        Ok(())
    }

    /// Removes claim `uid`'s files and directories, durably. Nothing there is success; the
    /// result says whether there was something.
    pub fn remove_claim(&self, uid: &str) -> Result<bool, MetadataError> {
        let uid = ClaimUid::new(uid)?;
        let dir = self.dir.join(uid.as_str());
        let removed = match fs::remove_dir_all(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(source) => return Err(io_error("removing device metadata", &dir, source)),
        };
        // Synced even when nothing was removed: an earlier removal may have crashed before it.
        match cdi::durable::sync_dir(&self.dir) {
            Ok(()) => Ok(removed),
            Err(e) if e.source.kind() == io::ErrorKind::NotFound => Ok(removed),
            Err(e) => Err(e.into()),
        }
    }

    /// The claims that have metadata here, sorted; entries that are not claim directories are
    /// not reported. A missing directory has none.
    pub fn claims(&self) -> Result<Vec<ClaimUid>, MetadataError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(io_error("listing device metadata", &self.dir, source)),
        };
        let mut uids = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|source| io_error("listing device metadata", &self.dir, source))?;
            let is_dir = entry
                .file_type()
                .map_err(|source| io_error("inspecting", &entry.path(), source))?
                .is_dir();
            if let (true, Ok(name)) = (is_dir, entry.file_name().into_string())
                && let Ok(uid) = ClaimUid::new(&name)
            {
                uids.push(uid);
            }
        }
        uids.sort();
        Ok(uids)
    }

    /// Removes the temporary files of writes a crash interrupted, in every claim's directories;
    /// how many. Only at start-up, when no write is in flight.
    pub fn remove_temporary_files(&self) -> Result<usize, MetadataError> {
        let mut removed = 0;
        for uid in self.claims()? {
            let dir = self.dir.join(uid.as_str());
            let entries = fs::read_dir(&dir)
                .map_err(|source| io_error("listing device metadata", &dir, source))?;
            for entry in entries {
                let entry =
                    entry.map_err(|source| io_error("listing device metadata", &dir, source))?;
                removed += cdi::durable::remove_temporary_files(&entry.path(), FILE_NAME)?;
            }
        }
        Ok(removed)
    }
}

/// At start-up, before anything is served: removes what crashed writes left, and the files of
/// every claim that neither the state accounts for nor has a CDI spec (`keep`): an unprepare or
/// a rollback that a crash interrupted after the spec went, or a lost state without specs.
/// Files of a spec stay whatever reconciliation decides about it, since the spec mounts them.
/// Failures are logged, never fatal: stale files hold nothing.
pub fn sweep_at_start(store: Option<&MetadataStore>, keep: &BTreeSet<String>) {
    let Some(store) = store else {
        return;
    };
    match store.remove_temporary_files() {
        Ok(0) => {}
        Ok(n) => {
            info!(files = n, dir = %store.dir().display(), "removed device metadata a crash left half written")
        }
        Err(e) => warn!(error = %stdx::errors::chain(&e), "cannot clean device metadata"),
    }
    let claims = match store.claims() {
        Ok(claims) => claims,
        Err(e) => {
            warn!(error = %stdx::errors::chain(&e), "cannot list device metadata");
            return;
        }
    };
    for uid in claims.iter().filter(|u| !keep.contains(u.as_str())) {
        match store.remove_claim(uid.as_str()) {
            Ok(_) => {
                info!(claim = %uid, "removed the device metadata of a claim neither the state nor a cdi spec accounts for")
            }
            Err(e) => {
                warn!(claim = %uid, error = %stdx::errors::chain(&e), "cannot remove stale device metadata")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use policy::AllocationResult;

    use super::*;

    const UID: &str = "0b2c9a5e-8f6d-4c1a-9e3b-2d7f1a6c4e80";

    fn claim(pod_claim_name: Option<&str>) -> Claim {
        let result = |request: &str, device: &str| AllocationResult {
            request: request.into(),
            pool: "node-a".into(),
            device: device.into(),
            ..AllocationResult::default()
        };
        Claim {
            uid: UID.into(),
            namespace: "default".into(),
            name: "web-0-cpus-x7k2p".into(),
            results: vec![
                result("cpus", "cpu4"),
                result("memory", "memory0"),
                result("cpus", "cpu5"),
            ],
            pod_claim_name: pod_claim_name.map(str::to_owned),
            ..Claim::default()
        }
    }

    fn attrs(cpus: &str) -> BTreeMap<String, AttributeValue> {
        BTreeMap::from([(
            "grantedCpus".to_owned(),
            AttributeValue::String(cpus.into()),
        )])
    }

    fn store(dir: &Path) -> MetadataStore {
        MetadataStore::new(dir, "d.io", MetadataVersion::ALL.to_vec())
    }

    #[test]
    fn a_file_per_request_lists_its_devices_in_order_and_each_result_mounts_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let c = claim(Some("cpus"));
        let files = store
            .files(&c, &[attrs("4"), BTreeMap::new(), attrs("5")])
            .unwrap();
        assert_eq!(
            files.iter().map(|f| f.request.as_str()).collect::<Vec<_>>(),
            ["cpus", "memory"]
        );
        assert_eq!(
            files[0]
                .metadata
                .devices
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            ["cpu4", "cpu5"]
        );
        let edits = store
            .with_mounts(&c, vec![ContainerEdits::with_env(["A=1".to_owned()]); 3])
            .unwrap();
        let mount = &edits[2].mounts[0];
        assert_eq!(
            mount.host_path,
            dir.path()
                .join(UID)
                .join("cpus/metadata.json")
                .display()
                .to_string()
        );
        assert_eq!(
            mount.container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpus/cpus/d.io-metadata.json"
        );
        assert_eq!(mount.options, ["ro", "bind"]);
        assert_eq!(edits[0].mounts, edits[2].mounts);
        assert_ne!(edits[1].mounts, edits[0].mounts);
    }

    #[test]
    fn files_are_written_once_and_anew_with_the_next_generation_when_they_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let c = claim(None);
        let uid = ClaimUid::new(UID).unwrap();
        let files = store
            .files(&c, &[attrs("4"), BTreeMap::new(), attrs("5")])
            .unwrap();
        store.write_claim(UID, &files).unwrap();
        let path = store.file_path(&uid, "cpus");
        let read = || RequestMetadata::decode(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(read().generation, 1);
        let inode = || std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
        let before = inode();
        store.write_claim(UID, &files).unwrap();
        assert_eq!(inode(), before, "the same content is not written again");
        let changed = store
            .files(&c, &[attrs("4"), BTreeMap::new(), attrs("6")])
            .unwrap();
        store.write_claim(UID, &changed).unwrap();
        assert_eq!(read().generation, 2);
        assert_eq!(
            read().devices[1].attributes["grantedCpus"],
            AttributeValue::String("6".into())
        );
        assert_eq!(store.claims().unwrap(), std::slice::from_ref(&uid));
        assert!(store.remove_claim(UID).unwrap());
        assert!(!store.remove_claim(UID).unwrap());
        assert!(store.claims().unwrap().is_empty());
    }

    #[test]
    fn names_that_cannot_be_directories_are_refused_before_any_io() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir.path().join("never"));
        let mut c = claim(None);
        c.results[0].request = "../etc".into();
        assert!(matches!(
            store.files(&c, &[]),
            Err(MetadataError::Request { .. })
        ));
        assert!(matches!(
            store.write_claim("../x", &[]),
            Err(MetadataError::Uid(_))
        ));
        assert!(matches!(
            store.files(&claim(None), &[attrs("4")]),
            Err(MetadataError::Attributes {
                attributes: 1,
                results: 3,
                ..
            })
        ));
        assert!(!dir.path().join("never").exists());
    }

    #[test]
    fn the_start_up_sweep_keeps_what_is_accounted_for_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let files = store.files(&claim(None), &[]).unwrap();
        store.write_claim(UID, &files).unwrap();
        store.write_claim("other-1", &files).unwrap();
        let half = dir.path().join(UID).join("cpus/.metadata.json.abc123.tmp");
        fs::write(&half, b"{").unwrap();
        fs::write(dir.path().join("not-a-claim.txt"), b"").unwrap();
        sweep_at_start(Some(&store), &BTreeSet::from([UID.to_owned()]));
        assert!(!half.exists());
        assert_eq!(store.claims().unwrap(), [ClaimUid::new(UID).unwrap()]);
        assert!(dir.path().join("not-a-claim.txt").exists());
    }
}
