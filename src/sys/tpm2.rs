//! The TPM dictionary-attack commands tss-esapi 7.7 does not wrap (`TPM2_DictionaryAttackParameters`,
//! `TPM2_DictionaryAttackLockReset`), called through tss-esapi-sys on a short-lived ESAPI context of
//! our own: tss-esapi keeps its `ESYS_CONTEXT` private, so its `Context` cannot lend one.
//!
//! Both commands authorize with the lockout hierarchy's authValue, which dirseal assumes empty (the
//! caller checks `lockoutAuthSet` first: a wrong lockout password would lock the lockout hierarchy).
use std::ffi::CStr;
use std::ptr::null_mut;

use tss_esapi_sys::{
    Esys_DictionaryAttackLockReset, Esys_DictionaryAttackParameters, Esys_Finalize, Esys_Initialize,
    Tss2_TctiLdr_Finalize, Tss2_TctiLdr_Initialize, ESYS_CONTEXT, ESYS_TR_NONE, ESYS_TR_PASSWORD, ESYS_TR_RH_LOCKOUT,
    TSS2_RC, TSS2_TCTI_CONTEXT,
};

/// What to do to the TPM's dictionary-attack protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DaCommand {
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

/// Frees the ESAPI context on every path; declared after [`Tcti`] so it drops first.
struct Esys(*mut ESYS_CONTEXT);

impl Drop for Esys {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful Esys_Initialize and is finalized once, before
        // the TCTI it uses.
        unsafe { Esys_Finalize(&mut self.0) }
    }
}

/// Runs `cmd` against the TPM named by `tcti` (a TCTI loader string such as
/// `device:/dev/tpmrm0`). Returns the raw TSS2 response code on failure.
pub fn dictionary_attack(tcti: &CStr, cmd: DaCommand) -> Result<(), TSS2_RC> {
    let mut tcti_ctx = Tcti(null_mut());
    // SAFETY: `tcti` is NUL-terminated and outlives the call; the out-pointer is a valid place.
    let rc = unsafe { Tss2_TctiLdr_Initialize(tcti.as_ptr(), &mut tcti_ctx.0) };
    if rc != 0 {
        return Err(rc);
    }
    let mut esys = Esys(null_mut());
    // SAFETY: `tcti_ctx.0` is an initialized TCTI that outlives `esys` (dropped after it); a NULL
    // ABI version asks for no check.
    let rc = unsafe { Esys_Initialize(&mut esys.0, tcti_ctx.0, null_mut()) };
    if rc != 0 {
        return Err(rc);
    }
    let rc = match cmd {
        // SAFETY: `esys.0` is an initialized context; ESYS_TR_RH_LOCKOUT with a password session
        // uses the (empty) lockout authValue; no other pointers are passed.
        DaCommand::Parameters { max_tries, recovery_time, lockout_recovery } => unsafe {
            Esys_DictionaryAttackParameters(
                esys.0,
                ESYS_TR_RH_LOCKOUT,
                ESYS_TR_PASSWORD,
                ESYS_TR_NONE,
                ESYS_TR_NONE,
                max_tries,
                recovery_time,
                lockout_recovery,
            )
        },
        // SAFETY: as above.
        DaCommand::LockReset => unsafe {
            Esys_DictionaryAttackLockReset(esys.0, ESYS_TR_RH_LOCKOUT, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE)
        },
    };
    if rc != 0 {
        return Err(rc);
    }
    Ok(())
}
