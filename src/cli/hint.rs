//! The CLI's own next step for a library error. Library texts name the problem and never a
//! command or flag, which only make sense here (the D-Bus service and PAM module add their own).
use dirseal::convert::ConvertError;
use dirseal::fido2::Fido2Error;
use dirseal::fscrypt::FscryptError;
use dirseal::keystore::KeystoreError;
use dirseal::ops::OpsError;
use dirseal::protector::ProtectorError;
use dirseal::recovery::RecoveryError;
use dirseal::tpm2::Tpm2Error;

/// The hint for the first error in `e`'s chain that has one.
pub fn hint(e: &anyhow::Error) -> Option<String> {
    e.chain().find_map(|cause| {
        // Transparent wrappers forward `source()` past the wrapped error, so each kind is
        // unwrapped here rather than found further down the chain.
        if let Some(c) = cause.downcast_ref::<ConvertError>() {
            return convert(c);
        }
        if let Some(o) = cause.downcast_ref::<OpsError>() {
            return ops(o);
        }
        if let Some(k) = cause.downcast_ref::<KeystoreError>() {
            return keystore(k);
        }
        if let Some(r) = cause.downcast_ref::<RecoveryError>() {
            return recovery(r);
        }
        if let Some(f) = cause.downcast_ref::<FscryptError>() {
            return fscrypt(f);
        }
        if let Some(p) = cause.downcast_ref::<ProtectorError>() {
            return protector(p);
        }
        if let Some(t) = cause.downcast_ref::<Tpm2Error>() {
            return tpm2(t);
        }
        cause.downcast_ref::<Fido2Error>().and_then(fido2)
    })
}

fn convert(e: &ConvertError) -> Option<String> {
    match e {
        ConvertError::OwnerActive { .. } => {
            Some("if you are sure nothing writes there, pass --force to convert anyway".into())
        }
        ConvertError::BadToken { path, .. } => Some(format!("run `dirseal convert --abort {}`", path.display())),
        ConvertError::Ops(o) => ops(o),
        _ => None,
    }
}

fn ops(e: &OpsError) -> Option<String> {
    match e {
        OpsError::AmbiguousProtector { .. } => Some("pick one with --protector ID".into()),
        // Only directories are encrypted: for a file there is nothing to suggest.
        OpsError::NotEncrypted { path } if !path.is_dir() => None,
        OpsError::NotEncrypted { path } => {
            let p = path.display();
            Some(format!("encrypt an empty directory with `dirseal encrypt {p}`, or one that holds data with `dirseal convert {p}`"))
        }
        OpsError::NotManaged { path, .. } => {
            Some(format!("if you have its recovery key, run `dirseal recovery restore {}`", path.display()))
        }
        OpsError::NotEmpty { path } => Some(format!("encrypt it in place with `dirseal convert {}`", path.display())),
        OpsError::AlreadyEncrypted { path, .. } => Some(format!("see `dirseal status {}`", path.display())),
        OpsError::NoProtector { .. } => {
            Some("see `dirseal status` and add one with `dirseal policy add-protector`".into())
        }
        OpsError::KeyMismatch { .. } => Some("`dirseal recovery restore DIR` restores it from the recovery key".into()),
        OpsError::UseAnother { dir, others, recovery, .. } => {
            let d = dir.display();
            let mut ways: Vec<String> =
                others.iter().map(|r| format!("`dirseal unlock {d} --protector {}` ({})", r.id, r.name)).collect();
            if *recovery {
                ways.push(format!("`dirseal unlock --recovery {d}`"));
            }
            (!ways.is_empty()).then(|| format!("unlock it with {}", ways.join(" or ")))
        }
        OpsError::PinIsLoginPassword { user } => Some(format!(
            "choose another PIN; or keep it and make {user} a PIN-login account: create the protector with \
             --allow-password-pin, then `dirseal pin-login enable {user}` removes the password hash"
        )),
        OpsError::NoPinProtector { user, home } => Some(format!(
            "`dirseal policy add-protector {} --protector-type tpm2 --user {user}` adds one",
            home.display()
        )),
        OpsError::Keystore(k) => keystore(k),
        OpsError::Recovery(r) => recovery(r),
        OpsError::Fscrypt(f) => fscrypt(f),
        OpsError::Protector(p) => protector(p),
        _ => None,
    }
}

fn keystore(e: &KeystoreError) -> Option<String> {
    match e {
        KeystoreError::NotFound { .. } => {
            Some("`dirseal protector list` and `dirseal policy list` show what exists".into())
        }
        KeystoreError::Corrupt { .. } => {
            Some("for a directory's policy, `dirseal recovery restore DIR` re-creates it from the recovery key".into())
        }
        KeystoreError::InUse { .. } => Some("remove it with `dirseal policy remove-protector`".into()),
        KeystoreError::LastProtector { .. } => Some("add one with `dirseal policy add-protector`".into()),
        _ => None,
    }
}

fn recovery(e: &RecoveryError) -> Option<String> {
    match e {
        RecoveryError::Missing { path } => {
            Some(format!("while it is unlocked, create one with `dirseal recovery add {}`", path.display()))
        }
        RecoveryError::Exists { path } => Some(format!("remove it with `dirseal recovery remove {}`", path.display())),
        RecoveryError::Blob { path, source } if source.is_damaged() => {
            let p = path.display();
            Some(format!("replace it: `dirseal recovery remove {p}`, then `dirseal recovery add {p}`"))
        }
        RecoveryError::Fscrypt(f) => fscrypt(f),
        _ => None,
    }
}

fn fscrypt(e: &FscryptError) -> Option<String> {
    match e {
        FscryptError::AlreadyEncrypted { path } => Some(format!("see `dirseal status {}`", path.display())),
        FscryptError::NotEmpty { path } => {
            Some(format!("encrypt it in place with `dirseal convert {}`", path.display()))
        }
        FscryptError::Locked { path } => Some(format!("run `dirseal unlock {}` first", path.display())),
        _ => None,
    }
}

fn protector(e: &ProtectorError) -> Option<String> {
    match e {
        ProtectorError::IncorrectSecret { .. } => {
            Some("forgotten? a directory's recovery key opens it: `dirseal unlock --recovery DIR`".into())
        }
        // A device's own error: the device tools (`dirseal tpm2`, `dirseal fido2`) have advice.
        _ => {
            let k = e.kind_error()?;
            k.downcast_ref::<Tpm2Error>().and_then(tpm2).or_else(|| k.downcast_ref::<Fido2Error>().and_then(fido2))
        }
    }
}

fn tpm2(e: &Tpm2Error) -> Option<String> {
    match e {
        Tpm2Error::LockoutNotOwned => Some(
            "run `dirseal tpm2 setup` first (it shows a TPM reset code to write down), or pass --no-pin for a \
             protector without PIN"
                .into(),
        ),
        Tpm2Error::WrongResetCode { .. } => {
            Some("`dirseal tpm2 status` shows when the TPM forgives failures without the code".into())
        }
        _ => None,
    }
}

fn fido2(e: &Fido2Error) -> Option<String> {
    match e {
        Fido2Error::Open { .. } => Some("`dirseal fido2 list` shows the connected security keys".into()),
        _ => None,
    }
}
