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
use std::collections::BTreeSet;
use std::ffi::CString;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dirseal_recovery::{ParseError, RecoveryKey};

use serde::{Deserialize, Serialize};
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::response_code::Tss2ResponseCode;
use tss_esapi::constants::{CapabilityType, PropertyTag, SessionType};
use tss_esapi::handles::{AuthHandle, KeyHandle, ObjectHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Auth, CapabilityData, Digest, EccPoint, KeyedHashScheme, PcrSelectionList, PcrSelectionListBuilder, PcrSlot,
    Private, Public, PublicBuilder, PublicEccParametersBuilder, PublicKeyedHashParameters, SensitiveData,
    SymmetricDefinition, SymmetricDefinitionObject,
};
use tss_esapi::traits::{Marshall, UnMarshall};
use tss_esapi::{Context, TctiNameConf};

use crate::kdf::{self, Argon2Params, KdfError};
use crate::secret::{Passphrase, ProtectorKey, PROTECTOR_KEY_LEN};
use crate::sys::tpm2::{dictionary_attack, DaCommand};

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
    fn conf(&self) -> TctiNameConf {
        // Invariant: constructed only by `from_str`, which checked this parse.
        TctiNameConf::from_str(&self.0).unwrap_or(TctiNameConf::Device(Default::default()))
    }
}

impl Default for Tcti {
    fn default() -> Self {
        Tcti(DEFAULT_TCTI.to_string())
    }
}

impl FromStr for Tcti {
    type Err = Tpm2Error;
    fn from_str(s: &str) -> Result<Tcti, Tpm2Error> {
        let bad = || Tpm2Error::BadTcti(s.to_string());
        let conf = TctiNameConf::from_str(s).map_err(|_| bad())?;
        // The loader needs the canonical "name:conf" form; also rejects interior NULs.
        CString::try_from(conf).map_err(|_| bad())?;
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

/// A set of SHA-256 bank PCR indices, each in 0..=[`MAX_PCR`]. Serialized as a sorted list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<u8>", into = "Vec<u8>")]
pub struct PcrSet(BTreeSet<u8>);

impl PcrSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        self.0.iter().copied()
    }
    fn selection(&self) -> Result<PcrSelectionList, Tpm2Error> {
        let slots: Vec<PcrSlot> = self
            .iter()
            .map(|i| PcrSlot::try_from(1u32 << i))
            .collect::<Result<_, _>>()
            .map_err(|e| Tpm2Error::Corrupt(format!("PCR selection: {e}")))?;
        PcrSelectionListBuilder::new()
            .with_selection(HashingAlgorithm::Sha256, &slots)
            .build()
            .map_err(|e| Tpm2Error::Corrupt(format!("PCR selection: {e}")))
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DaStatus {
    /// Failures counted now.
    pub lockout_counter: u32,
    /// Failures allowed before lockout.
    pub max_tries: u32,
    /// Seconds after which one counted failure is forgotten (0 = never: only a reset helps).
    pub recovery_time_s: u32,
    /// Seconds the lockout hierarchy stays blocked after a wrong lockout password.
    pub lockout_recovery_s: u32,
    pub in_lockout: bool,
    /// The lockout hierarchy has a password (`lockoutAuthSet`): nobody without it can reset the
    /// count of wrong PINs, so the limit on guessing holds. Without it, anyone can.
    pub lockout_owned: bool,
}

impl DaStatus {
    pub fn tries_left(&self) -> u32 {
        if self.in_lockout {
            0
        } else {
            self.max_tries.saturating_sub(self.lockout_counter)
        }
    }
}

/// New dictionary-attack parameters (`dirseal tpm2 setup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DaParameters {
    pub max_tries: u32,
    pub recovery_time_s: u32,
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

    fn auth(&self) -> &[u8] {
        self.0.expose_bytes()
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
    pub tries_left: u32,
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

#[derive(Debug, thiserror::Error)]
pub enum Tpm2Error {
    #[error("no usable TPM at {tcti}: {reason}; check that this machine has a TPM 2.0 (/dev/tpmrm0), or set tpm2.tcti in the config")]
    Unavailable { tcti: Tcti, reason: String },
    #[error("invalid TPM location (tpm2.tcti) {0:?}: expected e.g. \"device:/dev/tpmrm0\" or \"swtpm:host=127.0.0.1,port=2321\"")]
    BadTcti(String),
    #[error("invalid PCR selection: {0}")]
    BadPcrs(String),
    #[error("{}", wrong_pin(*.tries_left))]
    WrongPin { tries_left: Option<u32> },
    #[error("{}", lockout_message(*.recovery_time_s))]
    Lockout { recovery_time_s: Option<u32> },
    #[error("the TPM refused to unseal: PCRs {pcrs} changed since this protector was created (firmware, boot loader, Secure Boot or kernel change)")]
    PcrMismatch { pcrs: PcrSet },
    #[error("this TPM cannot open the sealed key: it was sealed by another TPM, or this TPM has been cleared since")]
    ForeignBlob,
    #[error("the TPM protector's sealed key is damaged: {0}")]
    Corrupt(String),
    #[error("the TPM has {tries_left} PIN tries left, and the last {min} are kept for the person at the device, so that nobody elsewhere can lock its owner out; type the PIN at the device (a local session), or wait for the TPM to forgive failures")]
    TriesKept { tries_left: u32, min: u32 },
    #[error("too many TPM PIN tries in a row; try again in {wait_s} s")]
    TooSoon { wait_s: u64 },
    #[error("a PIN is needed for this TPM protector")]
    PinRequired,
    #[error("the TPM's lockout hierarchy has no password, so anyone with this machine can reset the TPM's count of wrong PINs and guess a PIN without limit: a TPM PIN would protect nothing")]
    LockoutNotOwned,
    #[error("the TPM's lockout hierarchy already has a password (from an earlier setup, the operating system or another tool): nobody without it can reset the count of wrong PINs, so TPM PINs are protected; its parameters were left as they are")]
    LockoutOwned,
    #[error("the TPM reset code is mistyped: {0}")]
    ResetCodeTypo(String),
    #[error("{}", wrong_reset_code(*.lockout_recovery_s))]
    WrongResetCode { lockout_recovery_s: Option<u32> },
    #[error("the TPM refuses its lockout hierarchy for now, after a wrong reset code (lockout password); it accepts one again {}", after_recovery(*.lockout_recovery_s))]
    LockoutHierarchyBlocked { lockout_recovery_s: Option<u32> },
    #[error("the TPM's lockout hierarchy has a password: only its TPM reset code (shown once at setup, or the secret of whoever else set it) resets the count of wrong PINs; without it, wait for the TPM to forgive them")]
    ResetCodeNeeded,
    #[error("the TPM refused {action}: {rc}")]
    Tpm { action: &'static str, rc: String },
    #[error(transparent)]
    Kdf(#[from] KdfError),
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

/// The TPM-layer response code inside a tss-esapi error, if it came from the TPM.
fn tpm_rc(e: &tss_esapi::Error) -> Option<u32> {
    let tss_esapi::Error::Tss2Error(code) = e else { return None };
    let raw = match *code {
        Tss2ResponseCode::Success => return None,
        Tss2ResponseCode::FormatZero(rc) => rc.0,
        Tss2ResponseCode::FormatOne(rc) => rc.0,
    };
    // Layer 0 is the TPM itself; other layers are the TSS's own errors.
    (raw >> 16 == 0).then_some(raw)
}

const RC_FMT1: u32 = 0x080;
const RC_WARN: u32 = 0x900;
const TPM_RC_LOCKOUT: u32 = RC_WARN + 0x021;
const TPM_RC_AUTH_FAIL: u32 = RC_FMT1 + 0x00E;
const TPM_RC_BAD_AUTH: u32 = RC_FMT1 + 0x022;
const TPM_RC_POLICY_FAIL: u32 = RC_FMT1 + 0x01D;
const TPM_RC_INTEGRITY: u32 = RC_FMT1 + 0x01F;

/// The error number of a TPM response code with its handle/session/parameter number stripped.
fn rc_base(rc: u32) -> u32 {
    if rc & RC_FMT1 != 0 {
        rc & (RC_FMT1 | 0x3F)
    } else {
        rc & 0xFFF
    }
}

fn tpm_err(action: &'static str) -> impl Fn(tss_esapi::Error) -> Tpm2Error {
    move |e| match tpm_rc(&e).map(rc_base) {
        Some(TPM_RC_LOCKOUT) => Tpm2Error::Lockout { recovery_time_s: None },
        _ => Tpm2Error::Tpm { action, rc: e.to_string() },
    }
}

/// The TCG storage root key template (ECC NIST P-256, AES-128-CFB), `noDA`.
fn primary_template() -> Result<Public, tss_esapi::Error> {
    let attrs = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_no_da(true)
        .with_restricted(true)
        .with_decrypt(true)
        .build()?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attrs)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new_restricted_decryption_key(
                SymmetricDefinitionObject::AES_128_CFB,
                EccCurve::NistP256,
            )
            .build()?,
        )
        .with_ecc_unique_identifier(EccPoint::default())
        .build()
}

/// An open connection to a TPM.
pub struct Tpm {
    ctx: Context,
}

impl Tpm {
    pub fn open(tcti: &Tcti) -> Result<Tpm, Tpm2Error> {
        let ctx = Context::new(tcti.conf())
            .map_err(|e| Tpm2Error::Unavailable { tcti: tcti.clone(), reason: e.to_string() })?;
        Ok(Tpm { ctx })
    }

    pub fn da_status(&mut self) -> Result<DaStatus, Tpm2Error> {
        let first: u32 = PropertyTag::Permanent.into();
        let last: u32 = PropertyTag::LockoutRecovery.into();
        let (data, _) = self
            .ctx
            .get_capability(CapabilityType::TpmProperties, first, last - first + 1)
            .map_err(tpm_err("to report its dictionary-attack state"))?;
        let CapabilityData::TpmProperties(props) = data else {
            return Err(Tpm2Error::Tpm { action: "to report its properties", rc: "unexpected answer".into() });
        };
        let get = |tag: PropertyTag| {
            props.find(tag).map(|p| p.value()).ok_or(Tpm2Error::Tpm {
                action: "to report its dictionary-attack state",
                rc: format!("{tag:?} missing from the answer"),
            })
        };
        let permanent = get(PropertyTag::Permanent)?;
        Ok(DaStatus {
            lockout_counter: get(PropertyTag::LockoutCounter)?,
            max_tries: get(PropertyTag::MaxAuthFail)?,
            recovery_time_s: get(PropertyTag::LockoutInterval)?,
            lockout_recovery_s: get(PropertyTag::LockoutRecovery)?,
            // TPMA_PERMANENT: lockoutAuthSet is bit 2, inLockout bit 9.
            lockout_owned: permanent & (1 << 2) != 0,
            in_lockout: permanent & (1 << 9) != 0,
        })
    }

    /// The storage primary, recreated (same seed + same template = same key).
    fn primary(&mut self) -> Result<KeyHandle, Tpm2Error> {
        let template = primary_template().map_err(tpm_err("the storage key template"))?;
        let r = self
            .ctx
            .execute_with_nullauth_session(|ctx| ctx.create_primary(Hierarchy::Owner, template, None, None, None, None))
            .map_err(|e| match tpm_rc(&e).map(rc_base) {
                Some(TPM_RC_BAD_AUTH | TPM_RC_AUTH_FAIL) => Tpm2Error::Tpm {
                    action: "to create its storage key",
                    rc: "the owner hierarchy has a password; dirseal needs it empty".into(),
                },
                _ => tpm_err("to create its storage key")(e),
            })?;
        Ok(r.key_handle)
    }

    /// A session salted with `primary` that encrypts command and response parameters.
    fn session(&mut self, primary: KeyHandle, kind: SessionType) -> Result<AuthSession, Tpm2Error> {
        let err = tpm_err("to start a session");
        let s = self
            .ctx
            .start_auth_session(
                Some(primary),
                None,
                None,
                kind,
                SymmetricDefinition::AES_128_CFB,
                HashingAlgorithm::Sha256,
            )
            .map_err(&err)?
            .ok_or(Tpm2Error::Tpm { action: "to start a session", rc: "no session returned".into() })?;
        let (attrs, mask) = SessionAttributesBuilder::new().with_decrypt(true).with_encrypt(true).build();
        self.ctx.tr_sess_set_attributes(s, attrs, mask).map_err(&err)?;
        Ok(s)
    }

    /// PolicyPCR(current values) [+ PolicyAuthValue] into `session`.
    fn run_policy(&mut self, session: AuthSession, pcrs: &PcrSet, pin: bool) -> Result<(), Tpm2Error> {
        let policy = PolicySession::try_from(session)
            .map_err(|e| Tpm2Error::Tpm { action: "to start a policy session", rc: e.to_string() })?;
        let err = tpm_err("to evaluate the PCR policy");
        let selection = pcrs.selection()?;
        self.ctx.execute_without_session(|ctx| ctx.policy_pcr(policy, Digest::default(), selection)).map_err(&err)?;
        if pin {
            self.ctx.execute_without_session(|ctx| ctx.policy_auth_value(policy)).map_err(&err)?;
        }
        Ok(())
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
        let primary = self.primary()?;
        let policy_digest = if pcrs.is_empty() {
            Digest::default()
        } else {
            let trial = self.session(primary, SessionType::Trial)?;
            self.run_policy(trial, pcrs, pin.is_some())?;
            let policy = PolicySession::try_from(trial)
                .map_err(|e| Tpm2Error::Tpm { action: "to start a policy session", rc: e.to_string() })?;
            self.ctx.policy_get_digest(policy).map_err(tpm_err("to compute the PCR policy"))?
        };
        let attrs = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            // With no PIN there is nothing to guess: DA protection would only let someone else's
            // wrong PINs lock this protector out too.
            .with_no_da(pin.is_none())
            .with_user_with_auth(pcrs.is_empty())
            .with_admin_with_policy(!pcrs.is_empty())
            .build()
            .map_err(tpm_err("the sealed object's attributes"))?;
        let public = PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::KeyedHash)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attrs)
            .with_auth_policy(policy_digest)
            .with_keyed_hash_parameters(PublicKeyedHashParameters::new(KeyedHashScheme::Null))
            .with_keyed_hash_unique_identifier(Digest::default())
            .build()
            .map_err(tpm_err("the sealed object's template"))?;
        let data = SensitiveData::try_from(key.as_bytes().to_vec()).map_err(tpm_err("the key to seal"))?;
        let session = self.session(primary, SessionType::Hmac)?;
        // The parent's authValue is empty; the session encrypts the sensitive part (PIN-derived
        // authValue and the key) on its way in.
        let created = self
            .ctx
            .execute_with_session(Some(session), |ctx| ctx.create(primary, public, Some(auth), Some(data), None, None))
            .map_err(tpm_err("to seal the key"))?;
        let public = created.out_public.marshall().map_err(tpm_err("to encode the sealed object"))?;
        Ok(SealedKey { public, private: created.out_private.value().to_vec(), pcrs: pcrs.clone(), pin: pin_kdf })
    }

    /// Gives back the sealed key. A wrong PIN costs exactly one try of the TPM's lockout; this
    /// never retries.
    pub fn unseal(&mut self, sealed: &SealedKey, pin: Option<&Passphrase>) -> Result<ProtectorKey, Tpm2Error> {
        let pin = match (&sealed.pin, pin) {
            (Some(_), None) => return Err(Tpm2Error::PinRequired),
            (Some(_), Some(p)) => Some(p),
            (None, _) => None,
        };
        let auth = auth_value(pin, sealed.pin.as_ref())?;
        let public = Public::unmarshall(&sealed.public).map_err(|e| Tpm2Error::Corrupt(format!("public part: {e}")))?;
        let private =
            Private::try_from(sealed.private.clone()).map_err(|e| Tpm2Error::Corrupt(format!("private part: {e}")))?;
        let primary = self.primary()?;
        let object =
            self.ctx.execute_with_nullauth_session(|ctx| ctx.load(primary, private, public)).map_err(
                |e| match tpm_rc(&e).map(rc_base) {
                    Some(TPM_RC_INTEGRITY) => Tpm2Error::ForeignBlob,
                    Some(TPM_RC_LOCKOUT) => Tpm2Error::Lockout { recovery_time_s: None },
                    Some(_) => Tpm2Error::Corrupt(format!("the TPM rejected it: {e}")),
                    None => tpm_err("to load the sealed key")(e),
                },
            )?;
        let object: ObjectHandle = object.into();
        self.ctx.tr_set_auth(object, auth).map_err(tpm_err("to set the PIN"))?;
        let session = if sealed.pcrs.is_empty() {
            self.session(primary, SessionType::Hmac)?
        } else {
            let s = self.session(primary, SessionType::Policy)?;
            self.run_policy(s, &sealed.pcrs, sealed.pin.is_some())?;
            s
        };
        let out = self.ctx.execute_with_session(Some(session), |ctx| ctx.unseal(object));
        let data = match out {
            Ok(d) => d,
            Err(e) => {
                return Err(match tpm_rc(&e).map(rc_base) {
                    Some(TPM_RC_AUTH_FAIL | TPM_RC_BAD_AUTH) => {
                        Tpm2Error::WrongPin { tries_left: self.da_status().ok().map(|s| s.tries_left()) }
                    }
                    Some(TPM_RC_LOCKOUT) => {
                        Tpm2Error::Lockout { recovery_time_s: self.da_status().ok().map(|s| s.recovery_time_s) }
                    }
                    Some(TPM_RC_POLICY_FAIL) => Tpm2Error::PcrMismatch { pcrs: sealed.pcrs.clone() },
                    _ => tpm_err("to unseal the key")(e),
                })
            }
        };
        if data.value().len() != PROTECTOR_KEY_LEN {
            return Err(Tpm2Error::Corrupt(format!("unsealed {} bytes, expected {PROTECTOR_KEY_LEN}", data.len())));
        }
        ProtectorKey::from_slice(data.value())
            .ok_or(Tpm2Error::Corrupt(format!("unsealed key is not {PROTECTOR_KEY_LEN} bytes")))
    }
}

/// The sealed object's authValue: Argon2id(PIN, salt), or empty without a PIN.
fn auth_value(pin: Option<&Passphrase>, kdf: Option<&PinKdf>) -> Result<Auth, Tpm2Error> {
    let (Some(pin), Some(kdf)) = (pin, kdf) else { return Ok(Auth::default()) };
    let bytes = kdf::derive_bytes(pin, &kdf.salt, kdf.argon2)?;
    // 32 bytes = the SHA-256 name algorithm's digest size, the most an authValue may hold.
    Auth::try_from(bytes.to_vec()).map_err(|e| Tpm2Error::Tpm { action: "the PIN's authValue", rc: e.to_string() })
}

/// Owns the TPM's lockout hierarchy: sets the dictionary-attack parameters `p`, then gives the
/// lockout hierarchy `code` as its password, so that from then on only `code` (or waiting out the
/// TPM's recovery time) undoes wrong PINs. Refuses ([`Tpm2Error::LockoutOwned`]) when the
/// hierarchy already has a password: its owner keeps it, and the protection already holds.
pub fn setup(tcti: &Tcti, p: DaParameters, code: &ResetCode) -> Result<(), Tpm2Error> {
    if Tpm::open(tcti)?.da_status()?.lockout_owned {
        return Err(Tpm2Error::LockoutOwned);
    }
    da_command(
        tcti,
        &[],
        DaCommand::Parameters {
            max_tries: p.max_tries,
            recovery_time: p.recovery_time_s,
            lockout_recovery: p.lockout_recovery_s,
        },
    )?;
    let mut tpm = Tpm::open(tcti)?;
    let auth = Auth::try_from(code.auth().to_vec()).map_err(tpm_err("the reset code"))?;
    // A salted session that encrypts parameters: the new password does not cross the bus in clear.
    let primary = tpm.primary()?;
    let session = tpm.session(primary, SessionType::Hmac)?;
    tpm.ctx
        .execute_with_session(Some(session), |ctx| ctx.hierarchy_change_auth(AuthHandle::Lockout, auth))
        .map_err(tpm_err("to set the lockout hierarchy's password"))
}

/// Changes the dictionary-attack parameters of a TPM whose lockout is owned, with its reset code.
pub fn set_da_parameters(tcti: &Tcti, code: &ResetCode, p: DaParameters) -> Result<(), Tpm2Error> {
    let cmd = DaCommand::Parameters {
        max_tries: p.max_tries,
        recovery_time: p.recovery_time_s,
        lockout_recovery: p.lockout_recovery_s,
    };
    da_command(tcti, code.auth(), cmd)
}

/// Forgets every counted failure (`TPM2_DictionaryAttackLockReset`). Needs the reset code when
/// the lockout is owned (`None`: a lockout with no password, which anyone can reset).
pub fn reset_lockout(tcti: &Tcti, code: Option<&ResetCode>) -> Result<(), Tpm2Error> {
    // An empty password tried on an owned hierarchy would block it for its recovery time.
    if code.is_none() && Tpm::open(tcti)?.da_status()?.lockout_owned {
        return Err(Tpm2Error::ResetCodeNeeded);
    }
    da_command(tcti, code.map_or(&[][..], ResetCode::auth), DaCommand::LockReset)
}

fn da_command(tcti: &Tcti, auth: &[u8], cmd: DaCommand) -> Result<(), Tpm2Error> {
    let name = CString::try_from(tcti.conf()).map_err(|_| Tpm2Error::BadTcti(tcti.0.clone()))?;
    let recovery = || Tpm::open(tcti).and_then(|mut t| t.da_status()).ok().map(|s| s.lockout_recovery_s);
    // One connection at a time: a TPM without a resource manager (swtpm) serves one client.
    dictionary_attack(&name, auth, cmd).map_err(|rc| match (rc >> 16 == 0).then(|| rc_base(rc)) {
        Some(TPM_RC_LOCKOUT) => Tpm2Error::LockoutHierarchyBlocked { lockout_recovery_s: recovery() },
        Some(TPM_RC_AUTH_FAIL | TPM_RC_BAD_AUTH) if auth.is_empty() => Tpm2Error::ResetCodeNeeded,
        Some(TPM_RC_AUTH_FAIL | TPM_RC_BAD_AUTH) => Tpm2Error::WrongResetCode { lockout_recovery_s: recovery() },
        _ => Tpm2Error::Tpm { action: "the dictionary-attack command", rc: format!("TSS2 response code {rc:#x}") },
    })
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
    fn response_codes_lose_their_handle_numbers() {
        // AUTH_FAIL on session 1 (0x98e) and LOCKOUT.
        assert_eq!(rc_base(0x98e), TPM_RC_AUTH_FAIL);
        assert_eq!(rc_base(0x9a2), TPM_RC_BAD_AUTH);
        assert_eq!(rc_base(0x921), TPM_RC_LOCKOUT);
        assert_eq!(rc_base(0x99d), TPM_RC_POLICY_FAIL);
        assert_eq!(rc_base(0x1df), TPM_RC_INTEGRITY);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_secs(2), "2 s");
        assert_eq!(human_secs(1000), "17 min");
        assert_eq!(human_secs(7500), "2 h 5 min");
    }
}
