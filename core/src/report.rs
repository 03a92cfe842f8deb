//! What a fleet agent collects of this machine (`dirseal report`, docs/formats.md): every
//! encrypted directory the keystore knows (owner, locked or not, protector kinds, recovery key,
//! escrow), the TPM's lockout, unfinished conversions, the product version. Read only, asking
//! nothing: no secret, no device touch, no prompt.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::escrow::{self, RecordStatus};
use crate::ids::KeyIdentifier;
use crate::keystore::PolicyRecord;
use crate::ops::{Dirseal, OpsError, PortableDir};
use crate::tpm2::{Tcti, Tpm};

/// The report's `format`.
pub const FORMAT: &str = "dirseal-report";
/// The report's `version`: raised only when a field changes meaning or goes away (new fields may
/// appear within a version).
pub const VERSION: u32 = 1;

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Always [`FORMAT`].
    pub format: &'static str,
    /// [`VERSION`].
    pub version: u32,
    /// dirseal's version.
    pub product_version: &'static str,
    /// The machine's host name.
    pub host: String,
    /// `/etc/machine-id`, if any.
    pub machine_id: Option<String>,
    /// When the report was made (seconds since the epoch).
    pub generated_unix: u64,
    /// The keystore read.
    pub keystore: PathBuf,
    /// The machine's escrow settings; `null` when it escrows nothing.
    pub escrow: Option<EscrowSettings>,
    /// Every encrypted directory the keystore has a policy for.
    pub directories: Vec<Directory>,
    /// Portable directories on mounted media: their records travel with the medium, and this
    /// machine's keystore does not know them (docs/portable.md).
    pub portable_directories: Vec<PortableDir>,
    /// The TPM.
    pub tpm: TpmState,
    /// Conversions and decrypts recorded and not finished (interrupted, or kept for a commit).
    pub unfinished_conversions: Vec<Unfinished>,
    /// Records that could not be read (named in each message).
    pub problems: Vec<String>,
}

/// `[escrow]` as in force.
#[derive(Clone, Debug, Serialize)]
pub struct EscrowSettings {
    /// Where records go.
    pub dir: PathBuf,
    /// Whether encryption without escrow is refused.
    pub required: bool,
    /// The recipients' fingerprints.
    pub recipients: Vec<String>,
}

/// One encrypted directory.
#[derive(Clone, Debug, Serialize)]
pub struct Directory {
    /// Its policy (the kernel's key identifier).
    pub policy: KeyIdentifier,
    /// Where it was when encrypted; `null` if the record does not say.
    pub path: Option<PathBuf>,
    /// Whether that path is a directory with this policy now.
    pub present: bool,
    /// Its owner's uid, when present.
    pub owner_uid: Option<u32>,
    /// Its owner's login name, when the passwd database has one.
    pub owner: Option<String>,
    /// "locked", "unlocked", "partially-locked", or "unknown" (not present).
    pub state: &'static str,
    /// The kinds of its protectors, one per protector, sorted.
    pub protector_kinds: Vec<&'static str>,
    /// Whether it has a recovery key; `null` when it cannot be told (not present).
    pub recovery_key: Option<bool>,
    /// Its escrow record; `null` when the machine escrows nothing or it has no recovery key.
    pub escrow: Option<RecordStatus>,
}

/// The TPM, as `tpm2 status` sees it.
#[derive(Clone, Debug, Serialize)]
pub struct TpmState {
    /// Where it was looked for.
    pub tcti: Tcti,
    /// Whether it answered.
    pub present: bool,
    /// Why not, when it did not.
    pub reason: Option<String>,
    /// Whether its lockout hierarchy has a password (PIN guesses are then limited).
    pub lockout_owned: Option<bool>,
    /// Wrong PINs still accepted before lockout.
    pub tries_left: Option<u32>,
    /// Wrong PINs allowed in all.
    pub max_tries: Option<u32>,
    /// Whether it refuses every PIN now.
    pub in_lockout: Option<bool>,
}

/// A recorded conversion or decrypt that is not finished.
#[derive(Clone, Debug, Serialize)]
pub struct Unfinished {
    /// The directory.
    pub path: PathBuf,
    /// "encrypt" (convert) or "decrypt".
    pub direction: String,
    /// Its recorded step.
    pub state: String,
    /// Whether a process runs it now.
    pub running: bool,
    /// When it started.
    pub started_unix: u64,
}

/// The TPM's state; no TPM (no device node) is an answer, and the helper is not even started.
pub fn tpm_state(tcti: &Tcti) -> TpmState {
    let mut t = TpmState {
        tcti: tcti.clone(),
        present: false,
        reason: None,
        lockout_owned: None,
        tries_left: None,
        max_tries: None,
        in_lockout: None,
    };
    if let Some(dev) = tcti.as_str().strip_prefix("device:") {
        if !Path::new(dev).exists() {
            t.reason = Some(format!("{dev} does not exist"));
            return t;
        }
    }
    match Tpm::open(tcti).and_then(|mut tpm| tpm.da_status()) {
        Ok(da) => {
            t.present = true;
            t.lockout_owned = Some(da.lockout_owned);
            t.tries_left = Some(da.tries_left());
            t.max_tries = Some(da.max_tries);
            t.in_lockout = Some(da.in_lockout);
        }
        Err(e) => t.reason = Some(e.to_string()),
    }
    t
}

impl Directory {
    fn of(ds: &Dirseal, rec: &PolicyRecord) -> Directory {
        let path = rec.path_hint.clone();
        // Present: the path is a directory (not a symlink) encrypted with this very policy.
        let present = path.as_deref().is_some_and(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
                && crate::fscrypt::get_policy(p).ok().flatten().is_some_and(|pol| pol.identifier == rec.id)
        });
        let here = path.as_deref().filter(|_| present);
        let owner_uid = here.and_then(|p| std::fs::symlink_metadata(p).ok()).map(|m| m.uid());
        let (protectors, _) = ds.protectors_of(rec);
        let mut protector_kinds: Vec<&'static str> = protectors.iter().map(|p| p.kind.name()).collect();
        protector_kinds.sort_unstable();
        let recovery_key = here.map(|p| crate::recovery::read_blob(p).is_ok_and(|b| b.is_some()));
        let escrow = match (ds.escrow(), recovery_key) {
            (Some(e), Some(true)) => Some(e.status(&rec.id)),
            _ => None,
        };
        Directory {
            policy: rec.id,
            path,
            present,
            owner_uid,
            owner: owner_uid
                .and_then(|u| nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(u)).ok().flatten())
                .map(|u| u.name),
            state: if present { ds.policy_key_status(rec).unwrap_or("unknown") } else { "unknown" },
            protector_kinds,
            recovery_key,
            escrow,
        }
    }
}

/// Every directory the keystore has a policy for, with the records that could not be read.
pub fn directories(ds: &Dirseal) -> Result<(Vec<Directory>, Vec<String>), OpsError> {
    let mut problems = Vec::new();
    let mut dirs = Vec::new();
    for (_, p) in ds.keystore().policies()? {
        match p {
            Ok(rec) => dirs.push(Directory::of(ds, &rec)),
            Err(e) => problems.push(e.to_string()),
        }
    }
    Ok((dirs, problems))
}

/// The report of this machine.
pub fn report(ds: &Dirseal) -> Result<Report, OpsError> {
    let (directories, mut problems) = directories(ds)?;
    let (portable_directories, portable_problems) = ds.portable_dirs();
    problems.extend(portable_problems);
    let unfinished_conversions = match crate::convert::recorded() {
        Ok(v) => v
            .into_iter()
            .filter(|v| !v.state.is_final())
            .map(|v| Unfinished {
                path: v.source,
                direction: v.direction.to_string(),
                state: v.state.to_string(),
                running: v.running,
                started_unix: v.started_unix,
            })
            .collect(),
        Err(e) => {
            problems.push(format!("conversions: {e}"));
            Vec::new()
        }
    };
    Ok(Report {
        format: FORMAT,
        version: VERSION,
        product_version: env!("CARGO_PKG_VERSION"),
        host: escrow::host_name(),
        machine_id: escrow::machine_id(),
        generated_unix: escrow::now_unix(),
        keystore: ds.keystore().root().to_path_buf(),
        escrow: ds.escrow().map(|e| EscrowSettings {
            dir: e.dir().to_path_buf(),
            required: e.required(),
            recipients: e.fingerprints(),
        }),
        directories,
        portable_directories,
        tpm: tpm_state(&ds.config().tpm2.tcti()),
        unfinished_conversions,
        problems,
    })
}
