//! A scripted [`Ui`]: answers secrets from a list in order and questions with a fixed answer,
//! and records every prompt and question, so a test can check what a front end would have shown.
use std::path::Path;

use dirseal::ids::ProtectorId;
use dirseal::presence::Presence;
use dirseal::recovery::RecoveryKey;
use dirseal::secret::Passphrase;
use dirseal::ui::{Question, SecretPrompt, Ui, UiError};

#[derive(Default)]
pub struct Scripted {
    secrets: Vec<String>,
    /// The answer to every question.
    pub yes: bool,
    /// What was asked, in order: `secret: <prompt>`, `confirm: <question>`, `touch: <name>`.
    pub asked: Vec<String>,
    /// Recovery keys shown, as a person would write them down.
    pub recovery_keys: Vec<String>,
    /// The person is not at the device (a test of what a login from elsewhere may do); by default
    /// they are.
    pub elsewhere: bool,
}

impl Scripted {
    /// Answers secrets with `secrets` in order (then "input closed"), questions with no.
    pub fn new(secrets: &[&str]) -> Scripted {
        Scripted { secrets: secrets.iter().rev().map(|s| s.to_string()).collect(), ..Scripted::default() }
    }

    /// Answers every question yes.
    pub fn yes(mut self) -> Scripted {
        self.yes = true;
        self
    }
}

impl Ui for Scripted {
    fn secret(&mut self, prompt: &SecretPrompt<'_>) -> Result<Passphrase, UiError> {
        self.asked.push(format!("secret: {prompt:?}"));
        match self.secrets.pop() {
            Some(s) => Ok(Passphrase::from_str_copy(&s)),
            None => Err(UiError::NoInput { hint: "the test scripted no more secrets".into() }),
        }
    }

    fn confirm(&mut self, q: &Question<'_>) -> Result<bool, UiError> {
        self.asked.push(format!("confirm: {q:?}"));
        Ok(self.yes)
    }

    fn show_recovery_key(&mut self, dir: &Path, key: &RecoveryKey) -> Result<(), UiError> {
        self.asked.push(format!("recovery key for {}", dir.display()));
        self.recovery_keys.push(key.to_display().to_string());
        Ok(())
    }

    fn touch(&mut self, name: &str, _id: Option<&ProtectorId>) {
        self.asked.push(format!("touch: {name}"));
    }

    fn presence(&self) -> Presence {
        if self.elsewhere {
            Presence::Elsewhere
        } else {
            Presence::AtDevice
        }
    }
}
