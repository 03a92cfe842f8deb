//! Plain data the library shows front ends: what a conversion involves, before anyone says yes
//! ([`Summary`], [`Estimate`]), and a protector as listed ([`ProtectorSummary`]). It sits below
//! the modules that make it (crate::convert, crate::ops) and those that carry it (the
//! [`Ui`](crate::ui::Ui)'s questions, crate::remedy's remedies), so none of those needs another.
use std::path::PathBuf;

use dirseal_migrate::Method;
use serde::Serialize;

use crate::ids::ProtectorId;

/// What a new conversion involves, as a person should see it before saying yes (and as front
/// ends show it: the CLI's `plan` object).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// The directory.
    pub path: PathBuf,
    /// Entries below the directory.
    pub entries: u64,
    /// File data the copy moves: sizes, but sparse files count only their allocated data.
    pub data_bytes: u64,
    /// The sum of file sizes (what `ls` shows; more than the data when files are sparse).
    pub apparent_bytes: u64,
    /// Free space the copy needs, and what the filesystem has.
    pub space_needed: u64,
    /// Free space the filesystem has.
    pub space_available: u64,
    /// The directory's owner: they cannot log in (the PAM module refuses) or use the directory
    /// until the conversion is done. Root-owned directories have no such owner.
    pub owner_uid: u32,
    /// Their account name, if the password database has one.
    pub owner_name: Option<String>,
    /// Whether a recovery key will be made; `None`: the front end is asked next.
    pub recovery_key: Option<bool>,
    /// Whether the old plaintext is kept until the conversion is committed (or rolled back).
    pub keep_backup: bool,
    /// Whether the old plaintext is overwritten before deletion, then TRIMmed.
    pub wipe: bool,
    /// Copy or move, and whether [`Mode::Auto`](dirseal_migrate::Mode::Auto) picked it; what each would need.
    pub method: Method,
    /// Whether the method was picked by [`Mode::Auto`](dirseal_migrate::Mode::Auto) rather than asked for.
    pub auto: bool,
    /// Free space a copy needs.
    pub copy_needed: u64,
    /// Free space a move needs.
    pub move_needed: u64,
    /// The measured time estimate, if asked for and the probe could run.
    pub estimate: Option<Estimate>,
    /// Regular files and directories (the directory itself included) whose inode flags (other
    /// than casefold) or project id the conversion keeps, and the names of those flags
    /// ("nodump", "noatime", ...).
    pub flagged_entries: u64,
    /// The names of the flags [`Summary::flagged_entries`] have.
    pub kept_flags: Vec<&'static str>,
    /// Casefolded directories among them (kept casefolded).
    pub casefolded_dirs: u64,
}

/// A time estimate from rates measured on the filesystem itself, not constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Estimate {
    /// Encrypted writes, synced, into a probe directory on the filesystem.
    pub write_bytes_per_sec: u64,
    /// Creating one small encrypted file.
    pub micros_per_entry: u64,
    /// Copy (data at the write rate, entries at the per-entry cost) plus verification (reading
    /// both copies back, counted as half the copy's data time).
    pub seconds: u64,
}

/// A protector as shown to users and front ends.
#[derive(Clone, Debug, Serialize)]
pub struct ProtectorSummary {
    /// Its id.
    pub id: ProtectorId,
    /// Its name.
    pub name: String,
    /// Its kind's name, one of [`protector::KIND_NAMES`](crate::protector::KIND_NAMES).
    pub kind: &'static str,
    /// The user it belongs to, if any.
    pub uid: Option<u32>,
    /// Where its record is: "keystore" (this machine's; opens here only when the kind is bound to
    /// the machine) or "medium" (a portable directory's, opens on any machine).
    pub stored: &'static str,
}
