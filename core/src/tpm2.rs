//! Sealing a protector key in the TPM, behind a PIN the TPM's dictionary-attack lockout guards.
//!
//! - The storage primary key is recreated on every use from a fixed template (the TCG's ECC P-256
//!   SRK template) under the owner hierarchy: the same seed gives the same key, so there is no
//!   persistent handle to provision or lose. It is `noDA`: using it is never a "try".
//! - The protector key is sealed in a keyed-hash object whose authValue is Argon2id(PIN, salt): the
//!   TPM never sees the PIN itself, only a 32-byte value that is useless anywhere else. The object is
//!   *not* `noDA`, so every wrong PIN counts against the TPM's lockout. Without a PIN (`--no-pin`)
//!   it is `noDA`: nothing can be guessed, and it keeps opening while PINs are locked out.
//! - With PCRs, the object's policy is PolicyPCR(current values of those PCRs) [+ PolicyAuthValue],
//!   and `userWithAuth` is clear: the PIN alone no longer opens it once a bound PCR changes.
//! - Every session is salted with the primary key and encrypts parameters, so neither the sealed
//!   key nor the PIN's HMAC key crosses the bus in clear.
//!
//! A [`Tpm`] is a short-lived connection: dropping it flushes every transient object and session
//! it created (the tss-esapi `Context` tracks them), which matters on TPMs without a resource
//! manager such as swtpm.
//!
//! tss-esapi itself is linked only by the helper program `dirseal-tpm2` (crate::sys::helper):
//! a [`Tpm`] here is a running helper holding the connection, so nothing that links this library
//! maps libtss2-* until a TPM is used. The PIN is stretched here, in the caller; the helper gets
//! only the authValue.
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use dirseal_recovery::{ParseError, RecoveryKey};

use serde::{Deserialize, Serialize};

use crate::kdf::{self, Argon2Params, KdfError};
use crate::presence::Presence;
use crate::secret::{Passphrase, ProtectorKey, PROTECTOR_KEY_LEN};
use crate::sys::helper::{Helper, HelperError, Session, WireSecret};

/// The kernel's resource manager: several programs may use the TPM at once.
pub(crate) const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";
/// Highest PCR index a PC TPM has (24 PCRs).
pub(crate) const MAX_PCR: u8 = 23;
pub(crate) const PIN_SALT_LEN: usize = 16;

/// The PIN stretching for new TPM protectors. The TPM's lockout, not this cost, is what limits
/// guessing; Argon2id keeps the PIN itself away from the TPM and makes an authValue stolen from
/// the TPM's memory slow to invert.
pub(crate) const DEFAULT_PIN_KDF: Argon2Params = Argon2Params { time_cost: 2, memory_kib: 32 * 1024, parallelism: 1 };

/// Where the TPM is: a TCTI loader string (`device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=2321`,
/// `tabrmd:`), checked when parsed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Tcti(String);

impl Tcti {
    /// The loader string as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The TCTI grammar tss-esapi's `TctiNameConf` accepts (`name[:conf]`, name one of `device`,
/// `mssim`, `swtpm`, `tabrmd`; for the network TPMs an optional `host=` (an IP address or host
/// name) and `port=` (0..=65535)), checked here without linking it; the helper parses it again.
fn tcti_ok(s: &str) -> bool {
    if s.contains('\0') {
        return false;
    }
    let (name, conf) = s.split_once(':').unwrap_or((s, ""));
    match name {
        "device" | "tabrmd" => true,
        "mssim" | "swtpm" => {
            let field = |key: &str| conf.split(',').find_map(|kv| kv.strip_prefix(key));
            let host_ok = field("host=").is_none_or(|h| h.parse::<std::net::IpAddr>().is_ok() || hostname_ok(h));
            let port_ok = field("port=").is_none_or(|p| p.parse::<u16>().is_ok());
            host_ok && port_ok
        }
        _ => false,
    }
}

fn hostname_ok(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

impl Default for Tcti {
    fn default() -> Self {
        Tcti(DEFAULT_TCTI.to_string())
    }
}

impl FromStr for Tcti {
    type Err = Tpm2Error;
    fn from_str(s: &str) -> Result<Tcti, Tpm2Error> {
        if !tcti_ok(s) {
            return Err(Tpm2Error::BadTcti(s.to_string()));
        }
        Ok(Tcti(s.to_string()))
    }
}

impl TryFrom<String> for Tcti {
    type Error = Tpm2Error;
    fn try_from(s: String) -> Result<Tcti, Tpm2Error> {
        s.parse()
    }
}

impl From<Tcti> for String {
    fn from(t: Tcti) -> String {
        t.0
    }
}

impl fmt::Display for Tcti {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A set of SHA-256 bank PCR indices, each in 0..=23. Serialized as a sorted list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<u8>", into = "Vec<u8>")]
pub struct PcrSet(BTreeSet<u8>);

impl PcrSet {
    /// No PCR selected: the sealed key is not bound to the boot state.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The PCR indices, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        self.0.iter().copied()
    }
}

impl TryFrom<Vec<u8>> for PcrSet {
    type Error = Tpm2Error;
    fn try_from(v: Vec<u8>) -> Result<PcrSet, Tpm2Error> {
        let mut set = BTreeSet::new();
        for i in v {
            if i > MAX_PCR || !set.insert(i) {
                return Err(Tpm2Error::BadPcrs(format!("PCR {i} is out of range 0..={MAX_PCR} or repeated")));
            }
        }
        Ok(PcrSet(set))
    }
}

impl From<PcrSet> for Vec<u8> {
    fn from(s: PcrSet) -> Vec<u8> {
        s.0.into_iter().collect()
    }
}

/// `7,11` (what `--pcr` takes).
impl FromStr for PcrSet {
    type Err = Tpm2Error;
    fn from_str(s: &str) -> Result<PcrSet, Tpm2Error> {
        let v = s
            .split(',')
            .map(|x| x.trim().parse::<u8>().map_err(|_| Tpm2Error::BadPcrs(format!("{x:?} is not a PCR number"))))
            .collect::<Result<Vec<u8>, _>>()?;
        PcrSet::try_from(v)
    }
}

impl fmt::Display for PcrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.iter().map(|i| i.to_string()).collect();
        f.write_str(&v.join(","))
    }
}

/// How a PIN becomes the sealed object's authValue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinKdf {
    #[serde(with = "hex::serde")]
    pub(crate) salt: [u8; PIN_SALT_LEN],
    pub(crate) argon2: Argon2Params,
}

/// A protector key sealed by one TPM: what the keystore keeps. Useless without that TPM (and, when
/// `pin` is set, the PIN; when `pcrs` is not empty, the same PCR values).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedKey {
    /// The sealed object's `TPMT_PUBLIC`, marshalled.
    #[serde(with = "hex::serde")]
    pub public: Vec<u8>,
    /// Its `TPM2B_PRIVATE` contents (encrypted by the TPM under the storage primary).
    #[serde(with = "hex::serde")]
    pub private: Vec<u8>,
    /// PCRs (SHA-256 bank) the object's policy binds to; empty = not bound.
    pub pcrs: PcrSet,
    /// `None`: sealed with an empty authValue, unsealed without asking anything (`--no-pin`).
    pub pin: Option<PinKdf>,
}

/// The TPM's dictionary-attack state (`TPM2_GetCapability`, `TPM_PT_LOCKOUT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaStatus {
    /// Failures counted now.
    pub lockout_counter: u32,
    /// Failures allowed before lockout.
    pub max_tries: u32,
    /// Seconds after which one counted failure is forgotten (0 = never: only a reset helps).
    pub recovery_time_s: u32,
    /// Seconds the lockout hierarchy stays blocked after a wrong lockout password.
    pub lockout_recovery_s: u32,
    /// The TPM refuses every PIN until the lockout ends or is reset.
    pub in_lockout: bool,
    /// The lockout hierarchy has a password (`lockoutAuthSet`): nobody without it can reset the
    /// count of wrong PINs, so the limit on guessing holds. Without it, anyone can.
    pub lockout_owned: bool,
}

impl DaStatus {
    /// Wrong PINs the TPM still accepts before it locks out (0 while in lockout).
    pub fn tries_left(&self) -> u32 {
        if self.in_lockout {
            0
        } else {
            self.max_tries.saturating_sub(self.lockout_counter)
        }
    }
}

/// New dictionary-attack parameters (`dirseal tpm2 setup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaParameters {
    /// Failures allowed before lockout.
    pub max_tries: u32,
    /// Seconds after which one counted failure is forgotten (0 = never).
    pub recovery_time_s: u32,
    /// Seconds the lockout hierarchy stays blocked after a wrong reset code.
    pub lockout_recovery_s: u32,
}

/// What [`setup`] gives a TPM unless told otherwise, chosen for a 4-6 digit PIN:
/// - 6 wrong PINs before lockout: room for typos (and for the `min_local_tries` kept for the
///   person at the device), while a 4-digit PIN has a 6 in 10,000 chance of falling to them.
/// - one failure forgiven every 2 h (while powered on): a thief then gets 12 guesses a day, so
///   a 4-digit PIN holds for about 14 months on average, a 6-digit one for over a century.
/// - 10 min lockout recovery: a wrong reset code blocks the lockout hierarchy for 10 min, so
///   the 128-bit code cannot be guessed either, while its owner is not kept out for long.
pub const SETUP_DEFAULTS: DaParameters = DaParameters { max_tries: 6, recovery_time_s: 7200, lockout_recovery_s: 600 };

/// The TPM reset code: the lockout hierarchy's authorization, 128 random bits, shown once at
/// [`setup`] and kept nowhere by dirseal. Written down and typed like a recovery key (8 groups
/// of 6 digits, each with its own check), with the same encoder. No `Debug`, wiped on drop.
pub struct ResetCode(RecoveryKey);

/// In constant time (the key's own comparison).
impl PartialEq for ResetCode {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for ResetCode {}

impl ResetCode {
    /// A fresh random code, for [`setup`] to install and the front end to show once.
    pub fn generate() -> ResetCode {
        ResetCode(RecoveryKey::generate())
    }

    /// Parses a typed code; a typo is found (and its group named) before the TPM is asked, so a
    /// typo never costs the lockout hierarchy's recovery time.
    pub fn parse(typed: &Passphrase) -> Result<ResetCode, Tpm2Error> {
        let text = std::str::from_utf8(typed.as_bytes()).map_err(|_| Tpm2Error::ResetCodeTypo(typo_text(None)))?;
        RecoveryKey::parse(text).map(ResetCode).map_err(|e| Tpm2Error::ResetCodeTypo(typo_text(Some(&e))))
    }

    /// `123453-234564-...`, to be written down.
    pub fn to_display(&self) -> zeroize::Zeroizing<String> {
        self.0.to_display()
    }

    fn wire(&self) -> WireSecret {
        WireSecret::new(self.0.expose_bytes())
    }
}

/// A typo in a reset code, in the recovery key parser's words where they fit (group numbers), in
/// ours where that parser speaks of a recovery key.
fn typo_text(e: Option<&ParseError>) -> String {
    const SHAPE: &str = "a TPM reset code is 8 groups of 6 digits";
    match e {
        None => format!("it holds characters that are not digits; {SHAPE}"),
        Some(ParseError::NotADigit { ch, group: Some(g), .. }) => {
            format!("{ch:?} in group {g} is not a digit; {SHAPE}: check group {g} against the paper")
        }
        Some(ParseError::NotADigit { ch, .. }) => format!("{ch:?} is not a digit; {SHAPE}"),
        Some(ParseError::Length { digits, .. }) => {
            format!("{SHAPE} (48 digits), {digits} digits were typed: a group or digit is missing or extra")
        }
        Some(e) => e.to_string(),
    }
}

/// Whether one more TPM PIN try may be spent now: the one rule for every front end that can be
/// reached by someone other than the person holding the device (PAM, the D-Bus service).
///
/// The TPM's count of wrong PINs is shared by every PIN protector on the machine. So that nobody
/// can use the tries up and lock the owner out, the last `min_local_tries` are kept for someone
/// at the device (a local, active seat session; a console login), and a caller who is not may
/// try only while more remain. A caller with a rate limit (the service: per uid) also waits
/// [`PinTries::MIN_INTERVAL`] between tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinTries {
    /// Wrong PINs the TPM still accepts now ([`DaStatus::tries_left`]).
    pub tries_left: u32,
    /// Tries kept for someone at the device (config `[tpm2] min_local_tries`).
    pub min_local_tries: u32,
}

impl PinTries {
    /// The shortest time between two tries of one caller that is rate limited.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(3);

    /// `at_device`: the person is at the machine. `since_last_try`: for a rate-limited caller,
    /// how long ago their previous try was (`None`: no previous try, or not rate limited).
    pub fn may_try(&self, at_device: bool, since_last_try: Option<Duration>) -> Result<(), Tpm2Error> {
        if !at_device && self.tries_left <= self.min_local_tries {
            return Err(Tpm2Error::TriesKept { tries_left: self.tries_left, min: self.min_local_tries });
        }
        if let Some(wait) = since_last_try.and_then(|d| Self::MIN_INTERVAL.checked_sub(d)) {
            if !wait.is_zero() {
                return Err(Tpm2Error::TooSoon { wait_s: wait.as_secs() + 1 });
            }
        }
        Ok(())
    }
}

/// Why a TPM operation failed or was refused, worded for the person who has to act.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum Tpm2Error {
    /// No TPM answered at the configured location.
    #[error("no usable TPM at {tcti}: {reason}; if the TPM is elsewhere, set tpm2.tcti in the config")]
    Unavailable {
        /// Where the TPM was looked for.
        tcti: Tcti,
        /// What the TSS said.
        reason: String,
    },
    /// `tpm2.tcti` in the config is not a TPM location the TSS understands (the text given).
    #[error("invalid TPM location (tpm2.tcti) {0:?}: expected e.g. \"device:/dev/tpmrm0\" or \"swtpm:host=127.0.0.1,port=2321\"")]
    BadTcti(String),
    /// A PCR selection could not be parsed (why).
    #[error("invalid PCR selection: {0}")]
    BadPcrs(String),
    /// The TPM judged the PIN wrong and counted a failure.
    #[error("{}", wrong_pin(*.tries_left))]
    WrongPin {
        /// Tries left afterwards, if the TPM could be asked.
        tries_left: Option<u32>,
    },
    /// The TPM is in dictionary-attack lockout and refuses every PIN.
    #[error("{}", lockout_message(*.recovery_time_s))]
    Lockout {
        /// Seconds per forgiven failure, if known, to say when a try comes back.
        recovery_time_s: Option<u32>,
    },
    /// The boot state measured in the bound PCRs changed since sealing.
    #[error("the TPM refused to unseal: PCRs {pcrs} changed since this protector was created (firmware, boot loader, Secure Boot or kernel change)")]
    PcrMismatch {
        /// The PCRs the sealed key is bound to.
        pcrs: PcrSet,
    },
    /// The sealed key belongs to another TPM, or this one was cleared.
    #[error("this TPM cannot open the sealed key: it was sealed by another TPM, or this TPM has been cleared since")]
    ForeignBlob,
    /// The stored sealed key cannot be parsed (what is wrong).
    #[error("the TPM protector's sealed key is damaged: {0}")]
    Corrupt(String),
    /// A caller away from the device reached the tries kept for the person at it ([`PinTries`]).
    #[error("the TPM has {tries_left} PIN tries left, and the last {min} are kept for the person at the device, so that nobody elsewhere can lock its owner out; type the PIN at the device (a local session), or wait for the TPM to forgive failures")]
    TriesKept {
        /// Tries the TPM has left.
        tries_left: u32,
        /// Tries kept for someone at the device.
        min: u32,
    },
    /// A rate-limited caller tried again within [`PinTries::MIN_INTERVAL`].
    #[error("too many TPM PIN tries in a row; try again in {wait_s} s")]
    TooSoon {
        /// Seconds to wait before the next try is allowed.
        wait_s: u64,
    },
    /// The sealed key needs a PIN and none was given.
    #[error("a PIN is needed for this TPM protector")]
    PinRequired,
    /// A PIN protector was asked for on a TPM whose lockout anyone can reset (no `tpm2 setup`).
    #[error("the TPM's lockout hierarchy has no password, so anyone with this machine can reset the TPM's count of wrong PINs and guess a PIN without limit: a TPM PIN would protect nothing")]
    LockoutNotOwned,
    /// [`setup`] found the lockout hierarchy already owned and changed nothing.
    #[error("the TPM's lockout hierarchy already has a password (from an earlier setup, the operating system or another tool): nobody without it can reset the count of wrong PINs, so TPM PINs are protected; its parameters were left as they are")]
    LockoutOwned,
    /// A typed reset code is malformed (which group, what is wrong); the TPM was not asked.
    #[error("the TPM reset code is mistyped: {0}")]
    ResetCodeTypo(String),
    /// The TPM rejected the reset code and now blocks its lockout hierarchy for a while.
    #[error("{}", wrong_reset_code(*.lockout_recovery_s))]
    WrongResetCode {
        /// How long the block lasts, in seconds, if known.
        lockout_recovery_s: Option<u32>,
    },
    /// The lockout hierarchy is still blocked after an earlier wrong reset code.
    #[error("the TPM refuses its lockout hierarchy for now, after a wrong reset code (lockout password); it accepts one again {}", after_recovery(*.lockout_recovery_s))]
    LockoutHierarchyBlocked {
        /// How long such a block lasts, in seconds, if known.
        lockout_recovery_s: Option<u32>,
    },
    /// Resetting the lockout needs the reset code, and none was given.
    #[error("the TPM's lockout hierarchy has a password: only its TPM reset code (shown once at setup, or the secret of whoever else set it) resets the count of wrong PINs; without it, wait for the TPM to forgive them")]
    ResetCodeNeeded,
    /// The machine's TPM PIN lock could not be taken (where, why); no try was spent.
    #[error("no TPM PIN try was made: PIN tries are made one at a time on this machine, and its PIN lock could not be taken: {why}")]
    PinLock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The TPM is busy with other programs (out of room for objects or sessions: a TPM without a
    /// resource manager), not a fault of the key; nothing was counted.
    #[error("the TPM is busy with other programs and could not {action} ({rc}); no PIN try was counted: try again in a moment")]
    Busy {
        /// What was asked of the TPM.
        action: String,
        /// The TPM's response code, decoded.
        rc: String,
    },
    /// Any other TPM refusal.
    #[error("the TPM refused {action}: {rc}")]
    Tpm {
        /// What was asked of the TPM, for the message.
        action: String,
        /// The TPM's response code, decoded.
        rc: String,
    },
    /// The PIN's Argon2id parameters in the sealed key are out of bounds. Found by the caller,
    /// which stretches the PIN: never sent by the helper.
    #[error(transparent)]
    #[serde(skip)]
    Kdf(#[from] KdfError),
    /// tss-esapi's libraries are not installed on this machine.
    #[error("TPM support needs {library}, which is not installed; install the tpm2-tss libraries (Debian and Ubuntu: apt install libtss2-esys-3.0.2-0t64 libtss2-tctildr0t64, without t64 on older releases)")]
    NotInstalled {
        /// The missing library's file name.
        library: String,
    },
    /// The TPM helper program failed (why).
    #[error("{0}")]
    Helper(String),
}

impl From<HelperError> for Tpm2Error {
    fn from(e: HelperError) -> Tpm2Error {
        match e {
            HelperError::NotInstalled(library) => Tpm2Error::NotInstalled { library },
            HelperError::Failed(why) => Tpm2Error::Helper(why),
        }
    }
}

fn wrong_pin(tries_left: Option<u32>) -> String {
    match tries_left {
        Some(0) => "wrong TPM PIN; no tries left: the TPM now refuses every PIN until its lockout ends".into(),
        Some(1) => "wrong TPM PIN; 1 try left before the TPM locks out".into(),
        Some(n) => format!("wrong TPM PIN; {n} tries left before the TPM locks out"),
        None => "wrong TPM PIN".into(),
    }
}

fn lockout_message(recovery: Option<u32>) -> String {
    match recovery {
        Some(0) => "the TPM is locked out after too many wrong PINs and does not forgive failures over time; \
                    only resetting its lockout with the TPM reset code brings tries back"
            .into(),
        Some(s) => format!(
            "the TPM is locked out after too many wrong PINs; the next try comes back at most {} after the last \
             failure (while the machine stays on)",
            human_secs(s)
        ),
        None => "the TPM is locked out after too many wrong PINs; wait for it to forgive a failure".into(),
    }
}

fn after_recovery(s: Option<u32>) -> String {
    match s {
        Some(0) => "only after the machine restarts".into(),
        Some(s) => format!("{} after the wrong one (while the machine stays on)", human_secs(s)),
        None => "after its lockout recovery time".into(),
    }
}

fn wrong_reset_code(s: Option<u32>) -> String {
    format!("the TPM reset code is wrong (it is not this TPM's); the TPM accepts another {}", after_recovery(s))
}

/// `90 s`, `17 min`, `2 h 5 min`.
pub fn human_secs(s: u32) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s.div_ceil(60)),
        _ => format!("{} h {} min", s / 3600, (s % 3600).div_ceil(60)),
    }
}

/// The messages between this library and `dirseal-tpm2` (crate::sys::helper's framing).
#[doc(hidden)]
pub mod wire {
    use serde::{Deserialize, Serialize};

    use super::{DaParameters, DaStatus, PcrSet, SealedKey, Tcti, Tpm2Error};
    use crate::sys::helper::WireSecret;

    /// One request.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub enum Request {
        /// Connect to the TPM (kept for the requests that follow).
        Open { tcti: Tcti },
        /// The dictionary-attack state.
        DaStatus,
        /// Seal `key` under `auth` (the stretched PIN; none: empty), bound to `pcrs`.
        Seal { key: WireSecret, auth: Option<WireSecret>, pcrs: PcrSet },
        /// Unseal with `auth`.
        Unseal { sealed: SealedKey, auth: Option<WireSecret> },
        /// Take the lockout hierarchy (`dirseal tpm2 setup`).
        Setup { tcti: Tcti, params: DaParameters, code: WireSecret },
        /// New dictionary-attack parameters, with the reset code.
        SetDaParameters { tcti: Tcti, code: WireSecret, params: DaParameters },
        /// Forget counted failures (with the reset code when the lockout is owned).
        ResetLockout { tcti: Tcti, code: Option<WireSecret> },
    }

    /// One answer.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub enum Reply {
        /// To `Open`, `Setup`, `SetDaParameters`, `ResetLockout`.
        Done,
        /// To `DaStatus`.
        DaStatus(DaStatus),
        /// To `Seal`: the sealed object's public and private parts.
        Sealed {
            #[serde(with = "hex::serde")]
            public: Vec<u8>,
            #[serde(with = "hex::serde")]
            private: Vec<u8>,
        },
        /// To `Unseal`.
        Key(WireSecret),
    }

    /// A request's outcome.
    pub type Response = Result<Reply, Tpm2Error>;
}

use wire::{Reply, Request};

/// How long the helper may take for one request (a TPM is slow, not this slow).
const HELPER_TIMEOUT: Duration = Duration::from_secs(120);

fn unexpected() -> Tpm2Error {
    Tpm2Error::Helper("the TPM helper answered out of turn".into())
}

fn call(s: &mut Session, req: &Request) -> Result<Reply, Tpm2Error> {
    s.call::<_, wire::Response>(req, HELPER_TIMEOUT)?
}

/// One request on a helper of its own.
fn once(req: &Request) -> Result<(), Tpm2Error> {
    match call(&mut Session::start(Helper::Tpm2)?, req)? {
        Reply::Done => Ok(()),
        _ => Err(unexpected()),
    }
}

/// An open connection to a TPM, held by a `dirseal-tpm2` helper of its own.
pub struct Tpm {
    s: Session,
}

impl Tpm {
    /// Connects to the TPM at `tcti`.
    pub fn open(tcti: &Tcti) -> Result<Tpm, Tpm2Error> {
        // Missing TPM libraries are said first (the helper's greeting): they are missing on any
        // machine, with a TPM or not.
        let mut s = Session::start(Helper::Tpm2)?;
        // A TPM device that is not there is said plainly, before the TSS says "response code not
        // recognized" about it.
        if let Some(dev) = tcti.as_str().strip_prefix("device:") {
            if !Path::new(dev).exists() {
                return Err(Tpm2Error::Unavailable {
                    tcti: tcti.clone(),
                    reason: format!(
                        "{dev} does not exist: this machine has no TPM 2.0, or it is off in the firmware settings"
                    ),
                });
            }
        }
        match call(&mut s, &Request::Open { tcti: tcti.clone() })? {
            Reply::Done => Ok(Tpm { s }),
            _ => Err(unexpected()),
        }
    }

    /// Reads the dictionary-attack state (tries left, lockout, whether the lockout is owned).
    pub fn da_status(&mut self) -> Result<DaStatus, Tpm2Error> {
        match call(&mut self.s, &Request::DaStatus)? {
            Reply::DaStatus(st) => Ok(st),
            _ => Err(unexpected()),
        }
    }

    /// Seals `key` so that only this TPM, with `pin` (if any) and the current values of `pcrs`
    /// (if any), gives it back.
    pub fn seal(
        &mut self,
        key: &ProtectorKey,
        pin: Option<&Passphrase>,
        pcrs: &PcrSet,
        kdf_params: Argon2Params,
    ) -> Result<SealedKey, Tpm2Error> {
        let pin_kdf = match pin {
            Some(_) => {
                let mut salt = [0u8; PIN_SALT_LEN];
                rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut salt);
                kdf_params.check()?;
                Some(PinKdf { salt, argon2: kdf_params })
            }
            None => None,
        };
        let auth = auth_value(pin, pin_kdf.as_ref())?;
        let req = Request::Seal { key: WireSecret::new(key.as_bytes()), auth, pcrs: pcrs.clone() };
        match call(&mut self.s, &req)? {
            Reply::Sealed { public, private } => Ok(SealedKey { public, private, pcrs: pcrs.clone(), pin: pin_kdf }),
            _ => Err(unexpected()),
        }
    }

    /// Gives back the sealed key. A wrong PIN costs exactly one try of the TPM's lockout; this
    /// never retries. A PIN try is decided and spent under the machine's one PIN lock
    /// ([`PinGate`]): the TPM's tries left are read, [`PinTries::may_try`] is asked for
    /// `presence` with `min_local_tries` kept for the device, and the TPM answers, all before any
    /// other process on the machine may start a try of its own. So no number of logins or calls at
    /// once spends a try that the rule, asked alone, would have refused.
    pub fn unseal(
        &mut self,
        sealed: &SealedKey,
        pin: Option<&Passphrase>,
        presence: Presence,
        min_local_tries: u32,
    ) -> Result<ProtectorKey, Tpm2Error> {
        let pin = match (&sealed.pin, pin) {
            (Some(_), None) => return Err(Tpm2Error::PinRequired),
            (Some(_), Some(p)) => Some(p),
            (None, _) => None,
        };
        // Stretched before the lock is taken: the lock is held only for the TPM's own work.
        let auth = auth_value(pin, sealed.pin.as_ref())?;
        let _gate = match pin {
            Some(_) => {
                let gate = PinGate::enter(Path::new(PIN_GATE_DIR))?;
                let st = self.da_status()?;
                if st.in_lockout {
                    return Err(Tpm2Error::Lockout { recovery_time_s: Some(st.recovery_time_s) });
                }
                PinTries { tries_left: st.tries_left(), min_local_tries }.may_try(presence.at_device(), None)?;
                Some(gate)
            }
            // A sealed key without a PIN is `noDA`: opening it spends nothing.
            None => None,
        };
        match call(&mut self.s, &Request::Unseal { sealed: sealed.clone(), auth })? {
            Reply::Key(k) => ProtectorKey::from_slice(k.as_bytes())
                .ok_or(Tpm2Error::Corrupt(format!("unsealed key is not {PROTECTOR_KEY_LEN} bytes"))),
            _ => Err(unexpected()),
        }
    }
}

/// Where the machine-wide PIN lock lives: root's, like the PAM module's session records.
const PIN_GATE_DIR: &str = "/run/dirseal";
/// How long a PIN try waits for the one before it. A try holds the lock for one TPM command
/// (a second or two; [`HELPER_TIMEOUT`] at worst), so this is several tries' worth.
const PIN_GATE_WAIT: Duration = Duration::from_secs(60);

/// The machine's one PIN lock: an exclusive `flock` on `tpm2-pin.lock` in a root-owned 0700
/// directory, held by every process that spends a TPM PIN try (PAM, the CLI, the service) from
/// its check of the tries left to the TPM's answer. Only root can reach it, so no user can hold
/// it to keep others from logging in; a holder that hangs is waited for at most
/// [`PIN_GATE_WAIT`].
struct PinGate {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl PinGate {
    fn enter(dir: &Path) -> Result<PinGate, Tpm2Error> {
        let path = dir.join("tpm2-pin.lock");
        let busy =
            |e: crate::securefile::SecureFileError| Tpm2Error::PinLock { path: path.clone(), why: e.to_string() };
        crate::securefile::ensure_private_dir(dir).map_err(busy)?;
        let lock =
            crate::securefile::lock_file_within(&path, crate::securefile::Privacy::OwnerOnly, Some(PIN_GATE_WAIT))
                .map_err(busy)?;
        Ok(PinGate { _lock: lock })
    }
}

/// The sealed object's authValue: Argon2id(PIN, salt), or none (empty) without a PIN.
fn auth_value(pin: Option<&Passphrase>, kdf: Option<&PinKdf>) -> Result<Option<WireSecret>, Tpm2Error> {
    let (Some(pin), Some(kdf)) = (pin, kdf) else { return Ok(None) };
    let bytes = kdf::derive_bytes(pin, &kdf.salt, kdf.argon2)?;
    Ok(Some(WireSecret::new(&bytes[..])))
}

/// Owns the TPM's lockout hierarchy: sets the dictionary-attack parameters `p`, then gives the
/// lockout hierarchy `code` as its password, so that from then on only `code` (or waiting out the
/// TPM's recovery time) undoes wrong PINs. Refuses ([`Tpm2Error::LockoutOwned`]) when the
/// hierarchy already has a password: its owner keeps it, and the protection already holds.
pub fn setup(tcti: &Tcti, p: DaParameters, code: &ResetCode) -> Result<(), Tpm2Error> {
    once(&Request::Setup { tcti: tcti.clone(), params: p, code: code.wire() })
}

/// Changes the dictionary-attack parameters of a TPM whose lockout is owned, with its reset code.
pub fn set_da_parameters(tcti: &Tcti, code: &ResetCode, p: DaParameters) -> Result<(), Tpm2Error> {
    once(&Request::SetDaParameters { tcti: tcti.clone(), code: code.wire(), params: p })
}

/// Forgets every counted failure (`TPM2_DictionaryAttackLockReset`). Needs the reset code when
/// the lockout is owned (`None`: a lockout with no password, which anyone can reset).
pub fn reset_lockout(tcti: &Tcti, code: Option<&ResetCode>) -> Result<(), Tpm2Error> {
    once(&Request::ResetLockout { tcti: tcti.clone(), code: code.map(ResetCode::wire) })
}

/// Whether the TPM's lockout is owned; the check before a PIN is trusted to guard a key.
pub(crate) fn require_owned_lockout(tpm: &mut Tpm) -> Result<(), Tpm2Error> {
    if tpm.da_status()?.lockout_owned {
        Ok(())
    } else {
        Err(Tpm2Error::LockoutNotOwned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcr_sets_parse_strictly() {
        assert_eq!("7, 11".parse::<PcrSet>().unwrap().to_string(), "7,11");
        for bad in ["", "24", "7,7", "x", "-1"] {
            assert!(bad.parse::<PcrSet>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<PcrSet>("[0,23]").is_ok());
        assert!(serde_json::from_str::<PcrSet>("[24]").is_err());
    }

    #[test]
    fn tcti_strings_are_checked() {
        for ok in [DEFAULT_TCTI, "swtpm:host=127.0.0.1,port=2321", "device:/dev/tpm0"] {
            assert_eq!(String::from(ok.parse::<Tcti>().unwrap()), ok);
        }
        for bad in ["", "bogus:x", "swtpm:port=notanumber"] {
            assert!(bad.parse::<Tcti>().is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_secs(2), "2 s");
        assert_eq!(human_secs(1000), "17 min");
        assert_eq!(human_secs(7500), "2 h 5 min");
    }
}
