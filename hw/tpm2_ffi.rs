//! The TPM dictionary-attack commands tss-esapi 7.7 does not wrap (`TPM2_DictionaryAttackParameters`,
//! `TPM2_DictionaryAttackLockReset`), called through tss-esapi-sys on a short-lived ESAPI context of
//! our own: tss-esapi keeps its `ESYS_CONTEXT` private, so its `Context` cannot lend one.
//!
//! Both commands authorize with the lockout hierarchy's authValue (the TPM reset code once
//! `dirseal tpm2 setup` has run). They use an HMAC session, so that value never crosses the bus:
//! only an HMAC keyed with it does, and guessing a 128-bit key from that is hopeless.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr::null_mut;

use tss_esapi_sys::{
    Esys_DictionaryAttackLockReset, Esys_DictionaryAttackParameters, Esys_Finalize, Esys_FlushContext, Esys_Initialize,
    Esys_StartAuthSession, Esys_TR_SetAuth, Tss2_TctiLdr_Finalize, Tss2_TctiLdr_Initialize, ESYS_CONTEXT, ESYS_TR,
    ESYS_TR_NONE, ESYS_TR_RH_LOCKOUT, TPM2B_AUTH, TPMT_SYM_DEF, TSS2_RC, TSS2_TCTI_CONTEXT,
};
use zeroize::Zeroize;

/// TPM2_SE_HMAC, TPM2_ALG_NULL and TPM2_ALG_SHA256 (TPM 2.0 Part 2; not in the sys bindings).
const SE_HMAC: u8 = 0x00;
const ALG_NULL: u16 = 0x0010;
const ALG_SHA256: u16 = 0x000B;

/// What to do to the TPM's dictionary-attack protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DaCommand {
    /// `TPM2_DictionaryAttackParameters`: failures before lockout, seconds per forgiven failure,
    /// seconds before the lockout hierarchy may be tried again after a failure on it.
    Parameters { max_tries: u32, recovery_time: u32, lockout_recovery: u32 },
    /// `TPM2_DictionaryAttackLockReset`: forget every counted failure now.
    LockReset,
}

/// Frees the TCTI on every path.
struct Tcti(*mut TSS2_TCTI_CONTEXT);

impl Drop for Tcti {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful Tss2_TctiLdr_Initialize and is finalized once;
        // the function sets it to NULL.
        unsafe { Tss2_TctiLdr_Finalize(&mut self.0) }
    }
}

/// Frees the ESAPI context (and flushes its session) on every path; declared after [`Tcti`] so
/// it drops first.
struct Esys(*mut ESYS_CONTEXT, ESYS_TR);

impl Drop for Esys {
    fn drop(&mut self) {
        if self.1 != ESYS_TR_NONE {
            // SAFETY: `self.1` is a session this context started; a failed flush (already gone)
            // is harmless.
            unsafe { Esys_FlushContext(self.0, self.1) };
        }
        // SAFETY: the pointer came from a successful Esys_Initialize and is finalized once, before
        // the TCTI it uses.
        unsafe { Esys_Finalize(&mut self.0) }
    }
}

/// Runs `cmd` against the TPM named by `tcti` (a TCTI loader string such as
/// `device:/dev/tpmrm0`), authorized by the lockout hierarchy's authValue `lockout_auth` (at most
/// 64 bytes; empty when the hierarchy has none). Returns the raw TSS2 response code on failure.
pub(crate) fn dictionary_attack(tcti: &CStr, lockout_auth: &[u8], cmd: DaCommand) -> Result<(), TSS2_RC> {
    let mut auth = TPM2B_AUTH { size: 0, buffer: [0; 64] };
    let Some(dst) = auth.buffer.get_mut(..lockout_auth.len()) else {
        // TPM_RC_SIZE: longer than any digest, so no TPM could hold it.
        return Err(0x095);
    };
    dst.copy_from_slice(lockout_auth);
    // Fits: at most 64 (checked above).
    auth.size = lockout_auth.len() as u16;
    let r = run(tcti, &auth, cmd);
    auth.buffer.zeroize();
    r
}

fn run(tcti: &CStr, auth: &TPM2B_AUTH, cmd: DaCommand) -> Result<(), TSS2_RC> {
    let ok = |rc: TSS2_RC| if rc == 0 { Ok(()) } else { Err(rc) };
    let mut tcti_ctx = Tcti(null_mut());
    // SAFETY: `tcti` is NUL-terminated and outlives the call; the out-pointer is a valid place.
    ok(unsafe { Tss2_TctiLdr_Initialize(tcti.as_ptr(), &mut tcti_ctx.0) })?;
    let mut esys = Esys(null_mut(), ESYS_TR_NONE);
    // SAFETY: `tcti_ctx.0` is an initialized TCTI that outlives `esys` (dropped after it); a NULL
    // ABI version asks for no check.
    ok(unsafe { Esys_Initialize(&mut esys.0, tcti_ctx.0, null_mut()) })?;
    // SAFETY: an initialized context and a valid TPM2B_AUTH; ESYS copies the value.
    ok(unsafe { Esys_TR_SetAuth(esys.0, ESYS_TR_RH_LOCKOUT, auth) })?;
    // An unbound, unsalted HMAC session: the authorization is an HMAC keyed with the authValue.
    // SAFETY: the all-zero TPMT_SYM_DEF is a plain C struct (algorithm set to NULL below, its
    // unions then unused).
    let mut sym: TPMT_SYM_DEF = unsafe { std::mem::zeroed() };
    sym.algorithm = ALG_NULL;
    let mut session = ESYS_TR_NONE;
    // SAFETY: an initialized context; `sym` and `session` are valid for the call; NULL
    // nonceCaller asks ESYS for a random one.
    ok(unsafe {
        Esys_StartAuthSession(
            esys.0,
            ESYS_TR_NONE,
            ESYS_TR_NONE,
            ESYS_TR_NONE,
            ESYS_TR_NONE,
            ESYS_TR_NONE,
            std::ptr::null(),
            SE_HMAC,
            &sym,
            ALG_SHA256,
            &mut session,
        )
    })?;
    esys.1 = session;
    let rc = match cmd {
        // SAFETY: an initialized context and a session it started; no pointers are passed.
        DaCommand::Parameters { max_tries, recovery_time, lockout_recovery } => unsafe {
            Esys_DictionaryAttackParameters(
                esys.0,
                ESYS_TR_RH_LOCKOUT,
                session,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                max_tries,
                recovery_time,
                lockout_recovery,
            )
        },
        // SAFETY: as above.
        DaCommand::LockReset => unsafe {
            Esys_DictionaryAttackLockReset(esys.0, ESYS_TR_RH_LOCKOUT, session, ESYS_TR_NONE, ESYS_TR_NONE)
        },
    };
    ok(rc)
}
