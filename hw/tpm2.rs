//! `dirseal-tpm2`: dirseal's TPM helper, the only program that links tss-esapi (libtss2-esys,
//! -tctildr, -mu, -sys). dirseal, its PAM module and its service start it when a TPM protector
//! or a `dirseal tpm2` command needs the TPM, and speak to it over stdin/stdout
//! (core/src/sys/helper.rs). One helper holds one TPM connection; it ends when its input closes,
//! and dropping the connection flushes every transient object and session it created.
//!
//! What the TPM does is described in core/src/tpm2.rs (the caller's side). The PIN never comes
//! here: the caller stretches it with Argon2id and sends only the authValue.
#![deny(unsafe_code)]

#[path = "tpm2_ffi.rs"]
mod ffi;

use std::ffi::CString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::str::FromStr;

use dirseal::helper::{serve, WireSecret};
use dirseal::tpm2::wire::{Reply, Request, Response};
use dirseal::tpm2::{DaParameters, DaStatus, PcrSet, SealedKey, Tcti, Tpm2Error};
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
use zeroize::Zeroizing;

use ffi::{dictionary_attack, DaCommand};

const PROGRAM: &str = "dirseal-tpm2";
/// The length of a protector key, which is all this helper ever seals.
const PROTECTOR_KEY_LEN: usize = 32;

fn main() -> ExitCode {
    if std::env::args_os().len() > 1 || std::io::stdin().is_terminal() {
        eprintln!("{PROGRAM}: dirseal's TPM helper; dirseal starts it, it takes nothing on the command line");
        return ExitCode::from(2);
    }
    // The TSS logs to stderr unless told otherwise; its messages are not for the person at the
    // front end (each failure comes back as a Tpm2Error), and the environment is empty here.
    std::env::set_var("TSS2_LOG", "all+NONE");
    let mut tpm: Option<Tpm> = None;
    serve(PROGRAM, |req: Request| -> Response { handle(&mut tpm, req) })
}

fn auth(s: Option<WireSecret>) -> Result<Option<Auth>, Tpm2Error> {
    s.map(|s| {
        Auth::try_from(s.as_bytes().to_vec())
            .map_err(|e| Tpm2Error::Tpm { action: "the PIN's authValue".into(), rc: e.to_string() })
    })
    .transpose()
}

fn opened(tpm: &mut Option<Tpm>) -> Result<&mut Tpm, Tpm2Error> {
    tpm.as_mut().ok_or(Tpm2Error::Helper("the TPM helper was asked before a TPM was opened".into()))
}

fn handle(tpm: &mut Option<Tpm>, req: Request) -> Response {
    match req {
        Request::Open { tcti } => {
            *tpm = None;
            *tpm = Some(Tpm::open(&tcti)?);
            Ok(Reply::Done)
        }
        Request::DaStatus => Ok(Reply::DaStatus(opened(tpm)?.da_status()?)),
        Request::Seal { key, auth: a, pcrs } => {
            let (public, private) = opened(tpm)?.seal(key.as_bytes(), auth(a)?, &pcrs)?;
            Ok(Reply::Sealed { public, private })
        }
        Request::Unseal { sealed, auth: a } => {
            let key = opened(tpm)?.unseal(&sealed, auth(a)?)?;
            Ok(Reply::Key(WireSecret(key)))
        }
        Request::Setup { tcti, params, code } => setup(&tcti, params, code.as_bytes()).map(|()| Reply::Done),
        Request::SetDaParameters { tcti, code, params } => {
            set_da_parameters(&tcti, code.as_bytes(), params).map(|()| Reply::Done)
        }
        Request::ResetLockout { tcti, code } => {
            reset_lockout(&tcti, code.as_ref().map(WireSecret::as_bytes)).map(|()| Reply::Done)
        }
    }
}

/// The TSS's view of a location the library already checked.
fn conf(tcti: &Tcti) -> Result<TctiNameConf, Tpm2Error> {
    TctiNameConf::from_str(tcti.as_str()).map_err(|_| Tpm2Error::BadTcti(tcti.to_string()))
}

fn selection(pcrs: &PcrSet) -> Result<PcrSelectionList, Tpm2Error> {
    let slots: Vec<PcrSlot> = pcrs
        .iter()
        .map(|i| PcrSlot::try_from(1u32 << i))
        .collect::<Result<_, _>>()
        .map_err(|e| Tpm2Error::Corrupt(format!("PCR selection: {e}")))?;
    PcrSelectionListBuilder::new()
        .with_selection(HashingAlgorithm::Sha256, &slots)
        .build()
        .map_err(|e| Tpm2Error::Corrupt(format!("PCR selection: {e}")))
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
/// Warnings of a TPM that is busy, not of a bad object: out of room for objects or sessions (a
/// TPM without a resource manager, such as swtpm, serving other programs), or asking to retry.
const TPM_RC_BUSY: [u32; 6] =
    [RC_WARN + 0x002, RC_WARN + 0x003, RC_WARN + 0x004, RC_WARN + 0x008, RC_WARN + 0x00A, RC_WARN + 0x022];

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
        Some(rc) if TPM_RC_BUSY.contains(&rc) => Tpm2Error::Busy { action: action.into(), rc: e.to_string() },
        _ => Tpm2Error::Tpm { action: action.into(), rc: e.to_string() },
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
struct Tpm {
    ctx: Context,
}

impl Tpm {
    /// Connects to the TPM at `tcti`.
    fn open(tcti: &Tcti) -> Result<Tpm, Tpm2Error> {
        let ctx = Context::new(conf(tcti)?)
            .map_err(|e| Tpm2Error::Unavailable { tcti: tcti.clone(), reason: e.to_string() })?;
        Ok(Tpm { ctx })
    }

    /// Reads the dictionary-attack state (tries left, lockout, whether the lockout is owned).
    fn da_status(&mut self) -> Result<DaStatus, Tpm2Error> {
        let first: u32 = PropertyTag::Permanent.into();
        let last: u32 = PropertyTag::LockoutRecovery.into();
        let (data, _) = self
            .ctx
            .get_capability(CapabilityType::TpmProperties, first, last - first + 1)
            .map_err(tpm_err("to report its dictionary-attack state"))?;
        let CapabilityData::TpmProperties(props) = data else {
            return Err(Tpm2Error::Tpm { action: "to report its properties".into(), rc: "unexpected answer".into() });
        };
        let get = |tag: PropertyTag| {
            props.find(tag).map(|p| p.value()).ok_or(Tpm2Error::Tpm {
                action: "to report its dictionary-attack state".into(),
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
                    action: "to create its storage key".into(),
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
            .ok_or(Tpm2Error::Tpm { action: "to start a session".into(), rc: "no session returned".into() })?;
        let (attrs, mask) = SessionAttributesBuilder::new().with_decrypt(true).with_encrypt(true).build();
        self.ctx.tr_sess_set_attributes(s, attrs, mask).map_err(&err)?;
        Ok(s)
    }

    /// PolicyPCR(current values) [+ PolicyAuthValue] into `session`.
    fn run_policy(&mut self, session: AuthSession, pcrs: &PcrSet, pin: bool) -> Result<(), Tpm2Error> {
        let policy = PolicySession::try_from(session)
            .map_err(|e| Tpm2Error::Tpm { action: "to start a policy session".into(), rc: e.to_string() })?;
        let err = tpm_err("to evaluate the PCR policy");
        let selection = selection(pcrs)?;
        self.ctx.execute_without_session(|ctx| ctx.policy_pcr(policy, Digest::default(), selection)).map_err(&err)?;
        if pin {
            self.ctx.execute_without_session(|ctx| ctx.policy_auth_value(policy)).map_err(&err)?;
        }
        Ok(())
    }

    /// Seals `key` under `auth` (the stretched PIN; `None`: empty, no DA) bound to the current
    /// values of `pcrs` (if any); returns the sealed object's public and private parts.
    fn seal(&mut self, key: &[u8], auth: Option<Auth>, pcrs: &PcrSet) -> Result<(Vec<u8>, Vec<u8>), Tpm2Error> {
        let pin = auth.is_some();
        let auth = auth.unwrap_or_default();
        let primary = self.primary()?;
        let policy_digest = if pcrs.is_empty() {
            Digest::default()
        } else {
            let trial = self.session(primary, SessionType::Trial)?;
            self.run_policy(trial, pcrs, pin)?;
            let policy = PolicySession::try_from(trial)
                .map_err(|e| Tpm2Error::Tpm { action: "to start a policy session".into(), rc: e.to_string() })?;
            self.ctx.policy_get_digest(policy).map_err(tpm_err("to compute the PCR policy"))?
        };
        let attrs = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            // With no PIN there is nothing to guess: DA protection would only let someone else's
            // wrong PINs lock this protector out too.
            .with_no_da(!pin)
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
        let data = SensitiveData::try_from(key.to_vec()).map_err(tpm_err("the key to seal"))?;
        let session = self.session(primary, SessionType::Hmac)?;
        // The parent's authValue is empty; the session encrypts the sensitive part (PIN-derived
        // authValue and the key) on its way in.
        let created = self
            .ctx
            .execute_with_session(Some(session), |ctx| ctx.create(primary, public, Some(auth), Some(data), None, None))
            .map_err(tpm_err("to seal the key"))?;
        let public = created.out_public.marshall().map_err(tpm_err("to encode the sealed object"))?;
        Ok((public, created.out_private.value().to_vec()))
    }

    /// Gives back the sealed key, opened with `auth` (the stretched PIN, when it has one). A
    /// wrong PIN costs exactly one try of the TPM's lockout; this never retries.
    fn unseal(&mut self, sealed: &SealedKey, auth: Option<Auth>) -> Result<Zeroizing<Vec<u8>>, Tpm2Error> {
        let auth = auth.unwrap_or_default();
        let public = Public::unmarshall(&sealed.public).map_err(|e| Tpm2Error::Corrupt(format!("public part: {e}")))?;
        let private =
            Private::try_from(sealed.private.clone()).map_err(|e| Tpm2Error::Corrupt(format!("private part: {e}")))?;
        let primary = self.primary()?;
        let object =
            self.ctx.execute_with_nullauth_session(|ctx| ctx.load(primary, private, public)).map_err(
                |e| match tpm_rc(&e).map(rc_base) {
                    Some(TPM_RC_INTEGRITY) => Tpm2Error::ForeignBlob,
                    Some(TPM_RC_LOCKOUT) => Tpm2Error::Lockout { recovery_time_s: None },
                    Some(rc) if TPM_RC_BUSY.contains(&rc) => tpm_err("to load the sealed key")(e),
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
        Ok(Zeroizing::new(data.value().to_vec()))
    }
}

/// Owns the TPM's lockout hierarchy: sets the dictionary-attack parameters `p`, then gives the
/// lockout hierarchy `code` as its password, so that from then on only `code` (or waiting out the
/// TPM's recovery time) undoes wrong PINs. Refuses ([`Tpm2Error::LockoutOwned`]) when the
/// hierarchy already has a password: its owner keeps it, and the protection already holds.
fn setup(tcti: &Tcti, p: DaParameters, code: &[u8]) -> Result<(), Tpm2Error> {
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
    let auth = Auth::try_from(code.to_vec()).map_err(tpm_err("the reset code"))?;
    // A salted session that encrypts parameters: the new password does not cross the bus in clear.
    let primary = tpm.primary()?;
    let session = tpm.session(primary, SessionType::Hmac)?;
    tpm.ctx
        .execute_with_session(Some(session), |ctx| ctx.hierarchy_change_auth(AuthHandle::Lockout, auth))
        .map_err(tpm_err("to set the lockout hierarchy's password"))
}

/// Changes the dictionary-attack parameters of a TPM whose lockout is owned, with its reset code.
fn set_da_parameters(tcti: &Tcti, code: &[u8], p: DaParameters) -> Result<(), Tpm2Error> {
    let cmd = DaCommand::Parameters {
        max_tries: p.max_tries,
        recovery_time: p.recovery_time_s,
        lockout_recovery: p.lockout_recovery_s,
    };
    da_command(tcti, code, cmd)
}

/// Forgets every counted failure (`TPM2_DictionaryAttackLockReset`). Needs the reset code when
/// the lockout is owned (`None`: a lockout with no password, which anyone can reset).
fn reset_lockout(tcti: &Tcti, code: Option<&[u8]>) -> Result<(), Tpm2Error> {
    // An empty password tried on an owned hierarchy would block it for its recovery time.
    if code.is_none() && Tpm::open(tcti)?.da_status()?.lockout_owned {
        return Err(Tpm2Error::ResetCodeNeeded);
    }
    da_command(tcti, code.unwrap_or(&[]), DaCommand::LockReset)
}

fn da_command(tcti: &Tcti, auth: &[u8], cmd: DaCommand) -> Result<(), Tpm2Error> {
    let name = CString::try_from(conf(tcti)?).map_err(|_| Tpm2Error::BadTcti(tcti.to_string()))?;
    let recovery = || Tpm::open(tcti).and_then(|mut t| t.da_status()).ok().map(|s| s.lockout_recovery_s);
    // One connection at a time: a TPM without a resource manager (swtpm) serves one client.
    dictionary_attack(&name, auth, cmd).map_err(|rc| match (rc >> 16 == 0).then(|| rc_base(rc)) {
        Some(TPM_RC_LOCKOUT) => Tpm2Error::LockoutHierarchyBlocked { lockout_recovery_s: recovery() },
        Some(TPM_RC_AUTH_FAIL | TPM_RC_BAD_AUTH) if auth.is_empty() => Tpm2Error::ResetCodeNeeded,
        Some(TPM_RC_AUTH_FAIL | TPM_RC_BAD_AUTH) => Tpm2Error::WrongResetCode { lockout_recovery_s: recovery() },
        _ => {
            Tpm2Error::Tpm { action: "the dictionary-attack command".into(), rc: format!("TSS2 response code {rc:#x}") }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_codes_lose_their_handle_numbers() {
        // AUTH_FAIL on session 1 (0x98e) and LOCKOUT.
        assert_eq!(rc_base(0x98e), TPM_RC_AUTH_FAIL);
        assert_eq!(rc_base(0x9a2), TPM_RC_BAD_AUTH);
        assert_eq!(rc_base(0x921), TPM_RC_LOCKOUT);
        assert_eq!(rc_base(0x99d), TPM_RC_POLICY_FAIL);
        assert_eq!(rc_base(0x1df), TPM_RC_INTEGRITY);
    }
}
