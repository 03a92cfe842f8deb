//! Tang protectors: a random key-encryption key, encrypted to a tang server as a clevis JWE
//! ([`crate::tang`]); it opens only while that server answers (network-bound unlock). Nothing
//! secret is stored: the JWE opens only through the server's McCallum–Relyea exchange, and
//! `clevis decrypt < JWE` gives the same key.
//! On disk (docs/formats.md): `{"type": "tang", "jwe": "<compact JWE, as clevis writes it>"}`.
use serde::{Deserialize, Serialize};

use super::{Ask, Kind, KindError, KindOptions, NewKindOf, ProtectorError};
use crate::config::Config;
use crate::presence::Presence;
use crate::secret::{Passphrase, ProtectorKey};
use crate::tang::{TangError, TangJwe, TangUrl, KEY_LEN};
use crate::ui::{Question, Ui};
use crate::wrap::Kek;

/// A tang protector's record: the JWE, parsed when read (a file only parses into one this can
/// open).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TangFile", into = "TangFile")]
pub struct Tang {
    // Boxed: a parsed JWE holds its points, and a kind's record stays small in `ProtectorKind`.
    jwe: Box<TangJwe>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TangFile {
    jwe: String,
}

impl TryFrom<TangFile> for Tang {
    type Error = TangError;
    fn try_from(f: TangFile) -> Result<Tang, TangError> {
        let jwe = TangJwe::parse(&f.jwe)?;
        if jwe.plaintext_len() != KEY_LEN {
            return Err(TangError::BadJwe { reason: format!("it does not hold a {KEY_LEN}-byte key") });
        }
        Ok(Tang { jwe: Box::new(jwe) })
    }
}

impl From<Tang> for TangFile {
    fn from(t: Tang) -> TangFile {
        TangFile { jwe: t.jwe.as_str().to_string() }
    }
}

impl Tang {
    /// The server's URL.
    pub fn url(&self) -> &str {
        self.jwe.url().as_str()
    }

    /// The JWE, as `clevis decrypt` reads it.
    pub fn jwe(&self) -> &str {
        self.jwe.as_str()
    }
}

/// Where a new tang protector's key comes from.
#[derive(Clone, Debug)]
enum Source {
    /// A server, and the thumbprint of the signing key trusted to sign its advertisement (none
    /// yet: shown and confirmed through the Ui, [`NewKindOf::confirm`]).
    Server { url: TangUrl, thumbprint: Option<String> },
    /// A JWE made by `clevis encrypt tang` (its plaintext is the key).
    Import(Box<TangJwe>),
}

/// How to make a new tang protector.
#[derive(Clone, Debug)]
pub struct NewTang {
    source: Source,
}

/// The server's errors, sorted for the front ends: unreachable, or a key it no longer holds, is
/// "not now" (another protector or the recovery key opens the directory); the rest are refusals.
impl From<TangError> for ProtectorError {
    fn from(e: TangError) -> ProtectorError {
        match e {
            TangError::Unreachable { .. } | TangError::KeyGone { .. } | TangError::Status { .. } => {
                ProtectorError::NotNow(KindError::new(e))
            }
            e => ProtectorError::Kind(KindError::new(e)),
        }
    }
}

const NOTHING: Ask = Ask { secret: None, touch: false };

fn kek_of(plain: &[u8]) -> Result<Kek, TangError> {
    if plain.len() != KEY_LEN {
        return Err(TangError::BadJwe {
            reason: format!(
                "it holds {} bytes; a protector's key is {KEY_LEN} bytes (encrypt 32 random bytes: head -c 32 /dev/urandom | clevis encrypt tang ...)",
                plain.len()
            ),
        });
    }
    // Invariant: the length was just checked.
    Ok(Kek::from_slice(plain.try_into().expect("32 bytes")))
}

impl Kind for Tang {
    // The key opens only where the server answers: a carried-away disk must not take it along.
    const TRAVELS: bool = false;
    // A machine's key, not a person's: it opens directories, never a login.
    const OPENS_LOGIN: bool = false;

    fn ask(&self) -> Ask {
        NOTHING
    }

    fn aad(&self) -> String {
        format!("tang:{}", self.jwe.as_str())
    }

    fn kek(&self, _config: &Config, _secret: Option<&Passphrase>, _: Presence) -> Result<Kek, ProtectorError> {
        let plain = self.jwe.decrypt()?;
        Ok(kek_of(&plain)?)
    }
}

impl NewKindOf for NewTang {
    type Made = Tang;

    /// `url` and `thumbprint`, or `import` (a clevis JWE's text); administrators only: the
    /// machine then talks to that server.
    fn from_options(opts: &mut KindOptions) -> Result<NewTang, ProtectorError> {
        let url: Option<String> = opts.parse_privileged("url")?;
        let thumbprint: Option<String> = opts.parse_privileged("thumbprint")?;
        let import: Option<String> = opts.parse_privileged("import")?;
        let source = match (url, thumbprint, import) {
            (None, None, Some(jwe)) => {
                Source::Import(Box::new(TangJwe::parse(&jwe).map_err(|e| opts.bad_value("import", e.to_string()))?))
            }
            (Some(_), _, Some(_)) | (None, Some(_), Some(_)) => {
                return Err(
                    opts.bad_value("import", "an imported JWE names its own server: give no url or thumbprint".into())
                )
            }
            (Some(url), thumbprint, None) => {
                let url = TangUrl::parse(&url).map_err(|e| opts.bad_value("url", e.to_string()))?;
                if let Some(t) = &thumbprint {
                    if t.len() != 43 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                        return Err(opts.bad_value(
                            "thumbprint",
                            "it is a signing key's SHA-256 thumbprint, 43 base64url characters, as tang-show-keys prints it".into(),
                        ));
                    }
                }
                Source::Server { url, thumbprint }
            }
            (None, _, None) => {
                return Err(
                    opts.bad_value("url", "a tang protector needs its server's URL (or a clevis JWE to import)".into())
                )
            }
        };
        Ok(NewTang { source })
    }

    fn ask(&self) -> Ask {
        NOTHING
    }

    /// Without a thumbprint: the advertisement's signing keys are shown and must be confirmed,
    /// as clevis asks; the confirmed key is pinned for [`NewKindOf::create`].
    fn confirm(&self, _config: &Config, ui: &mut dyn Ui) -> Result<Option<NewTang>, super::UnlockError> {
        let Source::Server { url, thumbprint: None } = &self.source else { return Ok(None) };
        let adv = url.advertisement().map_err(ProtectorError::from)?;
        let thumbprints = adv.thumbprints();
        let yes = ui.confirm(&Question::TrustTangServer { url: url.as_str(), thumbprints: &thumbprints })?;
        if !yes {
            return Err(
                ProtectorError::from(TangError::NotTrusted { url: url.as_str().to_string(), thumbprints }).into()
            );
        }
        Ok(Some(NewTang { source: Source::Server { url: url.clone(), thumbprint: thumbprints.into_iter().next() } }))
    }

    fn create(&self, _config: &mut Config, _secret: Option<&Passphrase>) -> Result<(Tang, Kek), ProtectorError> {
        match &self.source {
            Source::Import(jwe) => {
                let plain = jwe.decrypt()?;
                let kek = kek_of(&plain)?;
                Ok((Tang { jwe: jwe.clone() }, kek))
            }
            Source::Server { url, thumbprint } => {
                let Some(thumbprint) = thumbprint else {
                    return Err(ProtectorError::NoAnswer { what: "tang server's confirmed signing key" });
                };
                let adv = url.advertisement()?;
                adv.check_signer(url, thumbprint)?;
                let key = ProtectorKey::random();
                let jwe = TangJwe::encrypt(url, &adv, key.as_bytes());
                // One exchange now: a server that advertises a key it does not hold is found out
                // here, not at the first unlock.
                let back = jwe.decrypt()?;
                if back.as_slice() != key.as_bytes() {
                    return Err(TangError::WrongKey { url: url.as_str().to_string() }.into());
                }
                Ok((Tang { jwe: Box::new(jwe) }, Kek::from_slice(key.as_bytes())))
            }
        }
    }
}
