//! The one door between the library and a human: the CLI, the PAM module and the daemon each
//! implement [`Ui`]. The library never prints, prompts or reads the terminal itself.
use std::path::Path;

use dirseal_recovery::RecoveryKey;

use crate::census::Summary;
use crate::ids::ProtectorId;
use crate::presence::Presence;
use crate::secret::Passphrase;

/// What a secret is being asked for, so each front end can word (or refuse) the prompt.
#[derive(Clone, Debug)]
pub enum SecretPrompt<'a> {
    /// The current password of an existing protector.
    Password {
        /// The protector's name, to show.
        name: &'a str,
        /// Its id, to tell protectors of the same name apart.
        id: &'a ProtectorId,
    },
    /// A new password for a protector being created or changed; front ends should ask twice.
    NewPassword {
        /// The protector's name, to show.
        name: &'a str,
        /// The user it belongs to: logging in as them unlocks only while this password is their
        /// login password, which the front end should say. `None`: no login opens it.
        uid: Option<u32>,
    },
    /// The PIN of an existing protector (a TPM or a security key checks it). `device` names what
    /// checks it ("TPM"; empty when unspecified); `tries_left` is how many wrong PINs it still
    /// takes before locking out, when it says.
    Pin {
        /// The protector's name, to show.
        name: &'a str,
        /// Its id, to tell protectors of the same name apart.
        id: &'a ProtectorId,
        /// What checks the PIN ("TPM"; empty when unspecified).
        device: &'static str,
        /// Wrong PINs the device still takes before locking out, when it says.
        tries_left: Option<u32>,
    },
    /// A new PIN for a protector being created or changed; front ends should ask twice.
    NewPin {
        /// The protector's name, to show.
        name: &'a str,
    },
    /// The PIN a security key already has, while a protector is being created on it: asked once.
    KeyPin {
        /// The protector being created.
        name: &'a str,
    },
    /// A recovery key, typed back from paper.
    RecoveryKey {
        /// The encrypted directory the key opens.
        dir: &'a Path,
    },
}

/// A yes/no question before something that cannot be taken back quietly.
#[derive(Clone, Debug)]
pub enum Question<'a> {
    /// Encrypt `dir` in place; the summary says what it involves (size, time, space, who is
    /// locked out meanwhile, whether a recovery key will be made).
    Convert {
        /// The directory to encrypt.
        dir: &'a Path,
        /// What the conversion involves, for the front end to show before asking.
        summary: &'a Summary,
    },
    /// Decrypt `dir` in place (back to plaintext); the summary is convert's.
    Decrypt {
        /// The encrypted directory.
        dir: &'a Path,
        /// What the decrypt involves.
        summary: &'a Summary,
    },
    /// Make a recovery key for `dir` (the way back in if every protector is lost).
    CreateRecoveryKey {
        /// The directory the key would open.
        dir: &'a Path,
    },
    /// Trust the tang server at `url`, whose advertisement these signing keys signed (their
    /// SHA-256 thumbprints, as the server's `tang-show-keys` prints them), as clevis asks.
    TrustTangServer {
        /// The server's URL.
        url: &'a str,
        /// The signing keys' thumbprints.
        thumbprints: &'a [String],
    },
}

/// Why no secret or answer came back.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// Input ended before a secret was read (a script, a closed pipe).
    #[error("no secret was given (input closed); {hint}")]
    NoInput {
        /// How to give the secret another way, in the front end's terms.
        hint: String,
    },
    /// A new secret and its repetition differ.
    #[error("the two new secrets differ; nothing was changed, run the command again")]
    Mismatch,
    /// An empty secret was given where one is required.
    #[error("an empty password or PIN is not allowed; nothing was changed")]
    Empty,
    /// The person cancelled (Ctrl-D, a "no", a front end that cannot ask).
    #[error("cancelled; nothing was changed")]
    Cancelled,
    /// A question could not be asked and nothing said yes in advance.
    #[error("{what} needs confirmation; {hint}")]
    Unconfirmed {
        /// What needed the confirmation.
        what: String,
        /// How to say yes without being asked (e.g. the CLI's `--yes`).
        hint: String,
    },
    /// The recovery key typed back differs from the one shown.
    #[error("the recovery key typed back differs from the one shown; nothing was saved, run the command again")]
    RecoveryKeyNotConfirmed,
    /// Reading the terminal or pipe failed.
    #[error("reading the secret failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Progress of a long job, for bars and JSON streams.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Progress {
    /// The phase's name as the engine reports it (docs/dbus.md lists them).
    pub phase: String,
    /// Bytes handled so far in this phase.
    pub bytes_done: u64,
    /// Bytes this phase handles in all.
    pub bytes_total: u64,
    /// Files handled so far in this phase.
    pub files_done: u64,
    /// Files this phase handles in all.
    pub files_total: u64,
}

/// What one file costs in the estimate, as bytes of data that take as long to write: creating,
/// naming (an encrypted name) and closing a file. Measured here (docs/performance.md) at about
/// 56 µs per file against 65 MB/s, about 4 KB; a machine with hardware AES writes data several
/// times faster, so files weigh more. A front end that measured both rates passes its own
/// ([`Eta::with_file_cost`]).
pub const FILE_COST_BYTES: u64 = 8 << 10;

/// Seconds left in a job's current phase, from its rate since the phase began; the same for every
/// front end (the CLI's `--json` progress and bar, the service's Progress signal).
///
/// The work of a phase counts its files as well as its bytes: a tail of small files holds little
/// data but most of the time, and a rate in bytes alone would promise it in seconds.
#[derive(Debug, Default)]
pub struct Eta {
    /// The phase, when it began and the work done then.
    phase: Option<(String, std::time::Instant, f64)>,
    /// Bytes one file counts as; `None`: [`FILE_COST_BYTES`].
    file_cost: Option<u64>,
}

impl Eta {
    /// An estimate in which one file costs as much time as writing `bytes` of data (from a
    /// measured rate of writes and of file creations).
    pub fn with_file_cost(bytes: u64) -> Eta {
        Eta { phase: None, file_cost: Some(bytes) }
    }

    /// The work `bytes` and `files` stand for, in bytes.
    fn work(&self, bytes: u64, files: u64) -> f64 {
        bytes as f64 + files as f64 * self.file_cost.unwrap_or(FILE_COST_BYTES) as f64
    }

    /// The part of the phase's work done at `p`, from 0 to 1 (what a bar shows, in step with
    /// the estimate).
    pub fn fraction(&self, p: &Progress) -> f64 {
        let total = self.work(p.bytes_total, p.files_total);
        if total > 0.0 {
            (self.work(p.bytes_done, p.files_done) / total).min(1.0)
        } else {
            0.0
        }
    }

    /// The estimate at `p`: -1 while unknown (the phase's first half second, or nothing done).
    pub fn seconds(&mut self, p: &Progress) -> i64 {
        let now = std::time::Instant::now();
        let work_now = self.work(p.bytes_done, p.files_done);
        let (start, start_work) = match &self.phase {
            Some((ph, t, w)) if *ph == p.phase => (*t, *w),
            _ => {
                self.phase = Some((p.phase.clone(), now, work_now));
                (now, work_now)
            }
        };
        let secs = now.duration_since(start).as_secs_f64();
        let done = work_now - start_work;
        if secs > 0.5 && done > 0.0 {
            let left = (self.work(p.bytes_total, p.files_total) - work_now).max(0.0);
            (left / (done / secs)).round() as i64
        } else {
            -1
        }
    }
}

/// What the library needs from a front end to reach a person; every method but `secret` has a
/// default for front ends that cannot show or ask that thing.
pub trait Ui {
    /// Asks for a secret; the prompt says which and for what, so the front end words it.
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError>;
    /// A protector waits for a touch of its device (a FIDO2 key) now; `id` is absent while one is
    /// being created. Front ends say so; the device itself waits.
    fn touch(&mut self, name: &str, _id: Option<&ProtectorId>) {
        self.notice(&format!("touch the security key of protector {name}"));
    }
    /// Asks a yes/no question. A front end that cannot ask answers no (or an error naming how
    /// to say yes without being asked).
    fn confirm(&mut self, _q: &Question<'_>) -> Result<bool, UiError> {
        Ok(false)
    }
    /// Shows a new recovery key, once, before it is used: the front end makes sure it was taken
    /// down (e.g. typed back). A front end that cannot show one refuses, and none is made.
    fn show_recovery_key(&mut self, _dir: &Path, _key: &RecoveryKey) -> Result<(), UiError> {
        Err(UiError::Cancelled)
    }
    /// A human-readable status line (e.g. "unlocked /home/alice"). Front ends may drop it.
    fn notice(&mut self, _msg: &str) {}
    /// Where the person answering is ([`crate::presence`]). The last `tpm2.min_local_tries` TPM
    /// PIN tries are spent only [`Presence::AtDevice`] ([`crate::tpm2::PinTries`]), so nobody
    /// elsewhere can lock the owner out, and a key touch never logs in from elsewhere. A front end
    /// that does not know says elsewhere.
    fn presence(&self) -> Presence {
        Presence::Elsewhere
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tail of small files: nearly all bytes are done, a third of the files are not. At the
    /// rate so far, the files' share of the work keeps the estimate from collapsing.
    #[test]
    fn small_file_tail_keeps_its_time() {
        let mut eta = Eta::with_file_cost(10_000);
        let p = |bytes_done, files_done| Progress {
            phase: "copying".into(),
            bytes_done,
            bytes_total: 100_000_000,
            files_done,
            files_total: 30_000,
        };
        eta.seconds(&p(0, 0));
        if let Some((_, t, _)) = &mut eta.phase {
            *t -= std::time::Duration::from_secs(10);
        }
        // 10 s for all the data and 20,000 files: 300 MB of work, 30 MB/s; 100 MB of work left.
        let s = eta.seconds(&p(100_000_000, 20_000));
        assert!((3..=4).contains(&s), "{s}");
        // Counted in bytes alone it would be 0 s.
        assert!((eta.fraction(&p(100_000_000, 20_000)) - 0.75).abs() < 1e-9);
    }

    #[test]
    fn unknown_at_first() {
        let mut eta = Eta::default();
        let p = Progress { phase: "x".into(), bytes_total: 10, files_total: 1, ..Default::default() };
        assert_eq!(eta.seconds(&p), -1);
    }
}
