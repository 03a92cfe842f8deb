//! The secrets a call brought, handed to the library as its [`Ui`] asks for them: the service
//! never prompts, so a secret the call did not carry is an error that says so.
use std::os::fd::OwnedFd;
use std::path::Path;

use dirseal::ids::ProtectorId;
use dirseal::presence::Presence;
use dirseal::recovery::RecoveryKey;
use dirseal::secret::Passphrase;
use dirseal::ui::{Question, SecretPrompt, Ui, UiError};

use crate::auth::Caller;

/// A call's secrets, each given to the library at most where it belongs.
pub struct Secrets {
    /// Current secrets of existing protectors; `None` answers for whichever the library picks.
    pub current: Vec<(Option<ProtectorId>, Passphrase)>,
    /// The new protector's password or PIN (or a security key's own PIN while one is made).
    pub new: Option<Passphrase>,
    pub recovery: Option<Passphrase>,
    /// Where the caller is ([`crate::auth::Caller::presence`]); TPM PIN tries kept for the device
    /// are spent only there.
    pub presence: Presence,
    /// Where a new conversion's recovery key goes (`Convert`'s `recovery_key_out`): written there
    /// once, before anything is encrypted; without it no key is made.
    pub recovery_out: Option<OwnedFd>,
}

/// No secrets, from a caller not known to be at the device.
impl Default for Secrets {
    fn default() -> Secrets {
        Secrets { current: Vec::new(), new: None, recovery: None, presence: Presence::Elsewhere, recovery_out: None }
    }
}

impl Secrets {
    /// None yet, from `caller` (with its presence).
    pub fn of(caller: &Caller) -> Secrets {
        Secrets { presence: caller.presence(), ..Default::default() }
    }
}

impl Ui for Secrets {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> std::result::Result<Passphrase, UiError> {
        let found = match prompt {
            SecretPrompt::Password { id, .. } | SecretPrompt::Pin { id, .. } => {
                // A secret for a named protector answers once; one for "whichever" answers each
                // protector the library tries (the login order tries several with it).
                match self.current.iter().position(|(k, _)| *k == Some(**id)) {
                    Some(i) => Some(self.current.remove(i).1),
                    None => self.current.iter().find(|(k, _)| k.is_none()).map(|(_, s)| s.duplicate()),
                }
            }
            // A security key's own PIN, asked while a protector is created on it, is the new
            // protector's secret as far as the caller is concerned.
            SecretPrompt::NewPassword { .. } | SecretPrompt::NewPin { .. } | SecretPrompt::KeyPin { .. } => {
                self.new.take()
            }
            SecretPrompt::RecoveryKey { .. } => self.recovery.take(),
        };
        found.ok_or_else(|| UiError::NoInput { hint: "the call carried no secret for this step".into() })
    }

    fn presence(&self) -> Presence {
        self.presence
    }

    /// A new conversion's recovery key, to the descriptor the call gave for it: the caller shows it
    /// (and has it confirmed) while the conversion goes on; the library seals the new key under it
    /// only once it was written. Without a descriptor none is shown, so none is made.
    fn show_recovery_key(&mut self, _dir: &Path, key: &RecoveryKey) -> std::result::Result<(), UiError> {
        let out = self.recovery_out.take().ok_or(UiError::Cancelled)?;
        let shown = key.to_display();
        // Sized up front: no reallocation leaves an unwiped copy.
        let mut line = zeroize::Zeroizing::new(String::with_capacity(shown.len() + 1));
        line.push_str(&shown);
        line.push('\n');
        crate::fdio::write_secret(out, line.as_bytes(), "recovery_key_out")
            .map_err(|e| UiError::NoInput { hint: e.message })
    }

    /// The call itself is the consent to a conversion or decrypt; recovery keys are made by
    /// `RecoveryAdd`, or by `Convert` given `recovery_key_out`.
    fn confirm(&mut self, q: &Question<'_>) -> std::result::Result<bool, UiError> {
        Ok(matches!(q, Question::Convert { .. } | Question::Decrypt { .. }))
    }
}
