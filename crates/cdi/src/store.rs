//! `SpecStore`: one CDI spec file per prepared claim in one directory, written atomically and
//! durably, removed idempotently, listed for start-up reconciliation, and read back (a claim's
//! edits) when the state that accounted for it is lost.
//!
//! A write is [`durable::replace`]: a temporary file in the same directory, named
//! `.<file>.<random>.tmp` (never ending in `.json` or `.yaml`, so the runtimes' scanners and
//! watchers ignore it), made 0644, fsynced, renamed over the spec's name, and the directory
//! fsynced. A reader therefore sees the old spec or the new one, never a mix; the rename of a name
//! from the same directory is also what makes a runtime's auto-refreshing CDI cache notice the
//! change. A crash can leave a temporary file behind; [`SpecStore::claims`] never reports one and
//! [`SpecStore::remove_temporary_files`] deletes them at start-up.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use crate::{
    claim::{self, CLASS, ClaimUid, MAX_UID_LEN, SPEC_EXTENSION, UidError},
    durable::{self, TEMP_RAND_LEN, TEMP_SUFFIX, WriteError},
    names::{self, NameError, QualifiedName},
    spec::{ContainerEdits, Device, Spec},
    validate::{self, ValidationError},
    version,
};

/// What [`SpecStore::set_aside`] appends to a spec's file name.
pub const SET_ASIDE_SUFFIX: &str = ".unreadable";
/// The mode of spec files: the runtime must read them.
const SPEC_MODE: u32 = 0o644;
/// The mode of a spec directory the store creates, as the reference writer creates it.
const DIR_MODE: u32 = 0o755;
/// The longest file name Linux file systems accept (NAME_MAX).
const NAME_MAX: usize = 255;

/// The longest vendor whose spec and temporary file names fit in 255 bytes (`NAME_MAX`) for
/// every UID: 167.
pub const MAX_STORE_VENDOR_LEN: usize = NAME_MAX
    - ".".len()
    - "-".len()
    - CLASS.len()
    - "_".len()
    - MAX_UID_LEN
    - SPEC_EXTENSION.len()
    - ".".len()
    - TEMP_RAND_LEN
    - TEMP_SUFFIX.len();

/// What can go wrong in the store. Every variant names the claim, path or value concerned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The vendor is not a valid CDI vendor.
    #[error("invalid cdi vendor for the spec store")]
    Vendor(#[source] NameError),
    /// The vendor is valid but too long for file names.
    #[error(
        "cdi vendor {vendor:?} is {len} bytes long; spec file names need it to be at most {max}"
    )]
    VendorTooLong {
        /// The vendor.
        vendor: String,
        /// Its length.
        len: usize,
        /// The limit, [`MAX_STORE_VENDOR_LEN`].
        max: usize,
    },
    /// The claim UID was refused before any path was built from it.
    #[error("refusing claim uid")]
    Uid(#[from] UidError),
    /// A claim without edits would be a spec without devices.
    #[error("claim {uid} has no edits; its spec needs at least one device")]
    NoEdits {
        /// The claim.
        uid: ClaimUid,
    },
    /// The claim's edits do not make a valid spec.
    #[error("the cdi spec for claim {uid} would be invalid")]
    Invalid {
        /// The claim.
        uid: ClaimUid,
        /// The rule broken, naming the field (`devices[i]` is the i-th edit).
        #[source]
        source: ValidationError,
    },
    /// A claim's spec on disk is not one the store wrote for it.
    #[error("cdi spec {path} of claim {uid} is not one this store writes: {reason}")]
    Foreign {
        /// The claim.
        uid: ClaimUid,
        /// The spec file.
        path: PathBuf,
        /// What does not match, or why it does not parse.
        reason: String,
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

impl From<WriteError> for StoreError {
    fn from(e: WriteError) -> Self {
        Self::Io {
            op: e.step,
            path: e.path,
            source: e.source,
        }
    }
}

/// The per-claim spec files of one vendor in one directory.
///
/// The store keeps no state: the directory is the truth, so several stores (or processes) may
/// look at it, but writes to the same claim must not race (the resource manager serialises them).
#[derive(Debug, Clone)]
pub struct SpecStore {
    dir: PathBuf,
    vendor: String,
}

impl SpecStore {
    /// A store writing `<dir>/<vendor>-device_<uid>.json` for kind `<vendor>/device`. Checks the
    /// vendor (CDI rules, the 253-character limit, and [`MAX_STORE_VENDOR_LEN`] for file names);
    /// touches no file.
    pub fn new(dir: impl Into<PathBuf>, vendor: &str) -> Result<Self, StoreError> {
        names::validate_vendor(vendor).map_err(StoreError::Vendor)?;
        if vendor.len() > MAX_STORE_VENDOR_LEN {
            return Err(StoreError::VendorTooLong {
                vendor: vendor.into(),
                len: vendor.len(),
                max: MAX_STORE_VENDOR_LEN,
            });
        }
        Ok(Self {
            dir: dir.into(),
            vendor: vendor.into(),
        })
    }

    /// The spec directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CDI vendor.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// Where the spec of claim `uid` is.
    pub fn spec_path(&self, uid: &ClaimUid) -> PathBuf {
        self.dir.join(claim::spec_file_name(&self.vendor, uid))
    }

    /// The spec the store writes for a claim: device `claim-<uid>-<i>` gets `edits[i]`, and
    /// `cdiVersion` is the minimum the spec needs.
    pub fn spec_for(&self, uid: &ClaimUid, edits: &[ContainerEdits]) -> Spec {
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: format!("{}/{CLASS}", self.vendor),
            devices: edits
                .iter()
                .enumerate()
                .map(|(i, e)| Device {
                    name: claim::device_name(uid, i),
                    container_edits: e.clone(),
                    ..Device::default()
                })
                .collect(),
            ..Spec::default()
        };
        spec.cdi_version = version::minimum_version(&spec).as_str().into();
        spec
    }

    /// Writes (or replaces) the spec of claim `uid`, one device per edit, and returns the devices'
    /// qualified names in order: `<vendor>/device=claim-<uid>-<i>` for `edits[i]`.
    ///
    /// When this returns, the spec is on disk and durable. Refuses an invalid UID, no edits, and
    /// edits that would make an invalid spec, before touching the file system.
    pub fn write_claim(
        &self,
        uid: &str,
        edits: &[ContainerEdits],
    ) -> Result<Vec<QualifiedName>, StoreError> {
        let uid = ClaimUid::new(uid)?;
        if edits.is_empty() {
            return Err(StoreError::NoEdits { uid });
        }
        let spec = self.spec_for(&uid, edits);
        let invalid = |source| StoreError::Invalid {
            uid: uid.clone(),
            source,
        };
        validate::validate_spec(&spec).map_err(invalid)?;
        let names = (0..edits.len())
            .map(|i| {
                claim::qualified_device_name(&self.vendor, &uid, i).map_err(|source| {
                    invalid(ValidationError::Name {
                        field: format!("devices[{i}].name"),
                        source,
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        durable::create_dir(&self.dir, DIR_MODE)?;
        durable::replace(
            &self.dir,
            &claim::spec_file_name(&self.vendor, &uid),
            &spec.to_json(),
            SPEC_MODE,
        )?;
        Ok(names)
    }

    /// Removes the spec of claim `uid`, durably. A missing spec (or directory) is success: the
    /// result says whether there was a spec to remove.
    pub fn remove_claim(&self, uid: &str) -> Result<bool, StoreError> {
        let uid = ClaimUid::new(uid)?;
        let path = self.spec_path(&uid);
        let removed = match fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(source) => return Err(io_error("removing cdi spec", &path, source)),
        };
        // Synced even when nothing was removed: an earlier removal may have crashed before its
        // sync, and success must mean the spec stays gone.
        match durable::sync_dir(&self.dir).map_err(StoreError::from) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
        Ok(removed)
    }

    /// Moves claim `uid`'s spec aside, durably: renames it to `<file>.unreadable` in the same
    /// directory (the runtimes' CDI scanners read only `.json` and `.yaml`, and
    /// [`SpecStore::claims`] no longer reports it), replacing an earlier one set aside, so an
    /// operator can still read what it was. Returns the new path, or `None` when there was no
    /// spec to move.
    pub fn set_aside(&self, uid: &str) -> Result<Option<PathBuf>, StoreError> {
        let uid = ClaimUid::new(uid)?;
        let path = self.spec_path(&uid);
        let mut aside = path.clone().into_os_string();
        aside.push(SET_ASIDE_SUFFIX);
        let aside = PathBuf::from(aside);
        match fs::rename(&path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_error("setting aside cdi spec", &path, source)),
        }
        durable::sync_dir(&self.dir)?;
        Ok(Some(aside))
    }

    /// The edits of claim `uid`'s spec on disk, in device order: what [`SpecStore::write_claim`]
    /// was given. Refuses ([`StoreError::Foreign`]) a spec that does not parse, is of another
    /// kind, or whose devices are not exactly `claim-<uid>-0`, `claim-<uid>-1`, … in order; a
    /// missing spec is an IO error.
    pub fn read_claim(&self, uid: &str) -> Result<Vec<ContainerEdits>, StoreError> {
        let uid = ClaimUid::new(uid)?;
        let path = self.spec_path(&uid);
        let data = fs::read(&path).map_err(|source| io_error("reading cdi spec", &path, source))?;
        let foreign = |reason: String| StoreError::Foreign {
            uid: uid.clone(),
            path: path.clone(),
            reason,
        };
        let spec = Spec::from_json(&data).map_err(|e| {
            foreign(match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            })
        })?;
        let kind = format!("{}/{CLASS}", self.vendor);
        if spec.kind != kind {
            return Err(foreign(format!(
                "its kind is {:?}, not {kind:?}",
                spec.kind
            )));
        }
        if spec.devices.is_empty() {
            return Err(foreign("it has no devices".into()));
        }
        if !spec.container_edits.is_empty() {
            return Err(foreign("it has spec-level container edits".into()));
        }
        spec.devices
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let want = claim::device_name(&uid, i);
                if d.name == want {
                    Ok(d.container_edits)
                } else {
                    Err(foreign(format!(
                        "devices[{i}] is named {:?}, not {want:?}",
                        d.name
                    )))
                }
            })
            .collect()
    }

    /// Whether a spec of claim `uid` is on disk.
    pub fn has_claim(&self, uid: &str) -> Result<bool, StoreError> {
        let uid = ClaimUid::new(uid)?;
        let path = self.spec_path(&uid);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(io_error("checking cdi spec", &path, source)),
        }
    }

    /// The claims this vendor has spec files for, sorted. Other vendors' files, other
    /// extensions, temporary files and names that carry no valid UID are not reported. A missing
    /// directory has no claims.
    pub fn claims(&self) -> Result<Vec<ClaimUid>, StoreError> {
        let mut uids = Vec::new();
        for name in self.file_names()? {
            if let Some(uid) = claim::uid_of_spec_file(&self.vendor, &name) {
                uids.push(uid);
            }
        }
        uids.sort();
        Ok(uids)
    }

    /// Deletes temporary files a crashed write left behind and returns how many. Call it only when
    /// no write is in flight (at start-up): a live write's temporary file looks the same.
    pub fn remove_temporary_files(&self) -> Result<usize, StoreError> {
        let spec_prefix = format!("{}-{CLASS}_", self.vendor);
        Ok(durable::remove_temporary_files(&self.dir, &spec_prefix)?)
    }

    // === internals ===

    /// The names of the non-directory entries of the directory (none if it is missing).
    fn file_names(&self) -> Result<Vec<String>, StoreError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(io_error("listing cdi spec directory", &self.dir, source)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry
                .map_err(|source| io_error("listing cdi spec directory", &self.dir, source))?;
            let is_dir = entry
                .file_type()
                .map_err(|source| io_error("inspecting", &entry.path(), source))?
                .is_dir();
            // Names that are not UTF-8 are never ours.
            if let (false, Ok(name)) = (is_dir, entry.file_name().into_string()) {
                names.push(name);
            }
        }
        Ok(names)
    }
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> StoreError {
    StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
