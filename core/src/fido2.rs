//! Security keys (FIDO2 authenticators) as dirseal sees them: which are connected, what each
//! says of itself, and which one holds a given credential — found by an assertion that asks for
//! no touch, so only the right key ever blinks.
//!
//! Connected keys are libfido2's hidraw devices plus the *socket devices* the root-owned config
//! names (`[fido2] socket_devices`: software authenticators for tests and demos). Nothing a
//! caller passes can add a device: `--device` must name one of these.
//!
//! libfido2 itself is linked only by the helper program `dirseal-fido2` (crate::sys::helper):
//! a [`Device`] here is a running helper holding the opened key, so nothing that links this
//! library maps libfido2, libcbor or libudev until a security key is used.
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::config::Fido2Config;
use crate::sys::helper::{Helper, HelperError, Session, WireSecret};

/// The relying party id of every dirseal credential. Fixed: a credential made for it is useless
/// to any website, and a website's credential is useless here.
pub(crate) const RP_ID: &str = "dirseal";
/// How long an unlock waits for a touch unless the config says otherwise.
pub(crate) const DEFAULT_TOUCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Opening a key and asking it whether it holds a credential takes milliseconds; a device that
/// takes longer is not the one.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl Fido2Config {
    pub(crate) fn touch_timeout(&self) -> Duration {
        self.touch_timeout_secs.map_or(DEFAULT_TOUCH_TIMEOUT, Duration::from_secs)
    }
}

/// Every connected key's path: hidraw devices, then the configured socket devices that exist.
pub(crate) fn device_paths(cfg: &Fido2Config) -> Result<Vec<DevicePath>, Fido2Error> {
    let mut out: Vec<DevicePath> = list_hid()?.into_iter().map(|d| DevicePath::Hid(d.path)).collect();
    out.extend(cfg.socket_devices.iter().filter(|p| p.exists()).map(|p| DevicePath::Socket(p.clone())));
    Ok(out)
}

/// A connected key, for `dirseal fido2 list`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Connected {
    /// The device path `--device` accepts.
    pub path: String,
    /// Manufacturer and product as the device reports them (empty for none).
    pub product: String,
    /// What the key said of itself; absent if it could not be opened (then `error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<AuthenticatorInfo>,
    /// Why the key could not be opened, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Every connected key and what it says of itself (`dirseal fido2 list`).
pub fn list(cfg: &Fido2Config) -> Result<Vec<Connected>, Fido2Error> {
    let hid = list_hid()?;
    let mut out = Vec::new();
    for p in device_paths(cfg)? {
        let product = match &p {
            DevicePath::Hid(h) => hid
                .iter()
                .find(|d| &d.path == h)
                .map(|d| format!("{} {}", d.manufacturer, d.product).trim().to_string())
                .unwrap_or_default(),
            DevicePath::Socket(_) => "software authenticator (socket)".into(),
        };
        let (info, error) = match Device::open(&p, PROBE_TIMEOUT).and_then(|mut d| d.info()) {
            Ok(i) => (Some(i), None),
            Err(e) => (None, Some(e.to_string())),
        };
        out.push(Connected { path: p.to_string(), product, info, error });
    }
    Ok(out)
}

/// The device `--device` names: one of the connected keys, never an arbitrary path.
pub(crate) fn resolve(cfg: &Fido2Config, given: &str) -> Result<DevicePath, Fido2Error> {
    device_paths(cfg)?
        .into_iter()
        .find(|p| p.to_string() == given)
        .ok_or_else(|| Fido2Error::Open { path: given.to_string(), reason: "no such security key is connected".into() })
}

/// The connected key holding `credential_id`, asked of each key without a touch.
pub(crate) fn find_holder(cfg: &Fido2Config, rp_id: &str, credential_id: &[u8]) -> Result<Device, Fido2Error> {
    for p in device_paths(cfg)? {
        let Ok(mut d) = Device::open(&p, PROBE_TIMEOUT) else { continue };
        let probe = AssertRequest { rp_id, credential_ids: &[credential_id], salt: None, pin: None, uv: false };
        if d.assert(&probe).is_ok() {
            d.set_timeout(cfg.touch_timeout())?;
            return Ok(d);
        }
    }
    Err(Fido2Error::NotConnected)
}

/// Length of an hmac-secret output for one 32-byte salt.
pub const HMAC_SECRET_LEN: usize = 32;
/// Longest a socket device may stay silent when libfido2 itself waits without limit (open): the
/// helper's bound on its reads, and so part of the library's wait for the helper.
#[doc(hidden)]
pub const SOCKET_SILENCE_CAP: Duration = Duration::from_secs(60);
/// Beyond the device's own timeout, how long the helper may take before it is stopped.
const HELPER_GRACE: Duration = Duration::from_secs(30);

/// Where an authenticator is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DevicePath {
    /// A hidraw node as listed by libfido2 (`/dev/hidrawN`).
    Hid(String),
    /// A unix socket speaking CTAPHID reports (software authenticators; root-configured only).
    Socket(PathBuf),
}

impl std::fmt::Display for DevicePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevicePath::Hid(p) => f.write_str(p),
            DevicePath::Socket(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A connected authenticator as listed, before opening it.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HidInfo {
    pub path: String,
    pub manufacturer: String,
    pub product: String,
    pub vendor_id: u16,
    pub product_id: u16,
}

/// What an opened authenticator says of itself (CTAP getInfo).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthenticatorInfo {
    /// CTAP versions the key speaks (`FIDO_2_0`, `U2F_V2`, …).
    pub versions: Vec<String>,
    #[doc(hidden)]
    pub extensions: Vec<String>,
    /// Option name → value (`clientPin`, `uv`, `up`, `rk`, …).
    #[doc(hidden)]
    pub options: Vec<(String, bool)>,
    #[doc(hidden)]
    pub pin_protocols: Vec<u8>,
}

impl AuthenticatorInfo {
    /// The value of option `name`; `None` when the key does not report it.
    pub fn option(&self, name: &str) -> Option<bool> {
        self.options.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    /// The key offers the hmac-secret extension, which every dirseal credential needs.
    pub fn hmac_secret(&self) -> bool {
        self.extensions.iter().any(|e| e == "hmac-secret")
    }
}

/// The 32-byte hmac-secret output: key material, zeroized on drop, no `Debug`.
pub struct HmacSecret(Zeroizing<[u8; HMAC_SECRET_LEN]>);

impl HmacSecret {
    /// The secret.
    pub fn as_bytes(&self) -> &[u8; HMAC_SECRET_LEN] {
        &self.0
    }

    /// A copy of `b`, which a key's answer gives (to the helper from libfido2, to the library
    /// from the helper); one of another length is not an hmac-secret.
    #[doc(hidden)]
    pub fn from_slice(b: &[u8]) -> Result<HmacSecret, Fido2Error> {
        let mut s = Zeroizing::new([0u8; HMAC_SECRET_LEN]);
        if b.len() != HMAC_SECRET_LEN {
            return Err(Fido2Error::Unsupported("the hmac-secret extension".into()));
        }
        s.copy_from_slice(b);
        Ok(HmacSecret(s))
    }
}

/// A PIN on its way to the authenticator, zeroized on drop.
pub struct Pin(Zeroizing<Vec<u8>>);

impl Pin {
    /// `None` if the PIN holds a NUL byte (no authenticator could take it).
    pub fn new(pin: &[u8]) -> Option<Pin> {
        if pin.contains(&0) {
            return None;
        }
        Some(Pin(Zeroizing::new(pin.to_vec())))
    }

    /// A PIN from the wire (in the helper); one with a NUL byte is one no key would take.
    #[doc(hidden)]
    pub fn from_wire(s: &WireSecret) -> Result<Pin, Fido2Error> {
        Pin::new(s.as_bytes()).ok_or(Fido2Error::PinPolicy)
    }

    /// The PIN with a NUL after it, as libfido2 takes it (in the helper); wiped on drop.
    #[doc(hidden)]
    pub fn nul_terminated(&self) -> Zeroizing<Vec<u8>> {
        let mut v = Zeroizing::new(Vec::with_capacity(self.0.len() + 1));
        v.extend_from_slice(&self.0);
        v.push(0);
        v
    }

    fn wire(&self) -> WireSecret {
        WireSecret::new(&self.0)
    }
}

/// Why a security key operation failed, worded for the person holding the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fido2Error {
    /// The device could not be opened or is not usable as a FIDO2 key.
    #[error("cannot open security key {path}: {reason}")]
    Open {
        /// The device path.
        path: String,
        /// Why not.
        reason: String,
    },
    /// No touch came within the timeout (seconds).
    #[error("no touch on the security key within {0} s")]
    Timeout(u64),
    /// The key judged the PIN wrong.
    #[error("wrong PIN for the security key{}", retries_left(*.retries))]
    PinInvalid {
        /// PIN tries the key has left, when it says.
        retries: Option<u32>,
    },
    /// The PIN is blocked for good; only a reset of the key helps.
    #[error("the security key's PIN is blocked after too many wrong PINs; only a reset of the key (which erases its credentials) unblocks it")]
    PinBlocked,
    /// Three wrong PINs in a row: the key wants to be replugged.
    #[error(
        "the security key refuses PINs after three wrong ones in a row; unplug it and plug it back in, then try again"
    )]
    PinAuthBlocked,
    /// The operation needs the key's PIN and none was given.
    #[error("the security key requires its PIN")]
    PinRequired,
    /// The key has no PIN, and the operation needs one.
    #[error("the security key has no PIN set")]
    PinNotSet,
    /// The key refused a new PIN's length.
    #[error("the security key rejected the new PIN (too short or too long: 4 to 63 characters)")]
    PinPolicy,
    /// The key does not hold the credential asked for.
    #[error("this security key does not hold the credential")]
    NoCredential,
    /// The key lacks a needed feature (named).
    #[error("the security key does not support {0}")]
    Unsupported(String),
    /// No connected key holds the credential.
    #[error("no connected security key holds this protector's credential; plug the key in and try again")]
    NotConnected,
    /// No security key is connected at all (while making a protector: there is no credential yet).
    #[error("no security key is plugged in (none on USB or NFC, and no socket device in the config); plug one in and try again")]
    NoKey,
    /// The operation was cancelled on the key.
    #[error("the operation was cancelled on the security key")]
    Cancelled,
    /// Any other libfido2 error.
    #[error("security key error: {msg} (libfido2 code {code})")]
    Other {
        /// libfido2's error code.
        code: i32,
        /// libfido2's description of it.
        msg: String,
    },
    /// libfido2 (or a library it needs) is not installed on this machine.
    #[error("security key (FIDO2) support needs {library}, which is not installed; install libfido2 (Debian and Ubuntu: apt install libfido2-1)")]
    NotInstalled {
        /// The missing library's file name.
        library: String,
    },
    /// The security key helper program failed (why).
    #[error("{0}")]
    Helper(String),
}

fn retries_left(r: Option<u32>) -> String {
    match r {
        Some(1) => "; 1 try left before the key blocks its PIN".into(),
        Some(n) => format!("; {n} tries left before the key blocks its PIN"),
        None => String::new(),
    }
}

impl From<HelperError> for Fido2Error {
    fn from(e: HelperError) -> Fido2Error {
        match e {
            HelperError::NotInstalled(library) => Fido2Error::NotInstalled { library },
            HelperError::Failed(why) => Fido2Error::Helper(why),
        }
    }
}

/// What a new credential is made for (see [`Device::make_credential`]).
pub struct CredentialRequest<'a> {
    /// The relying party (dirseal's is `fido2::RP_ID`).
    pub rp_id: &'a str,
    /// The user handle stored with the credential.
    pub user_id: &'a [u8],
    /// The user name stored with it.
    pub user_name: &'a str,
    /// The key's PIN, when it has one.
    pub pin: Option<&'a Pin>,
    /// Ask for user verification (PIN or biometrics) besides presence.
    pub uv: bool,
}

/// What to ask for in an assertion.
pub struct AssertRequest<'a> {
    /// The relying party the credential was made for (dirseal's is `fido2::RP_ID`).
    pub rp_id: &'a str,
    /// Credentials to accept; the key answers with the one it holds.
    pub credential_ids: &'a [&'a [u8]],
    /// None = a probe: which credential does this key hold (no touch, no secret).
    pub salt: Option<&'a [u8; 32]>,
    /// The key's PIN, when the credential needs user verification.
    pub pin: Option<&'a Pin>,
    /// Ask for user verification (PIN or biometrics) besides presence.
    pub uv: bool,
}

/// One hmac-secret from an assertion, with the credential that produced it.
pub struct Assertion {
    /// The credential the key answered with.
    pub credential_id: Vec<u8>,
    /// The hmac-secret, when a salt was given.
    pub secret: Option<HmacSecret>,
    /// The key verified the user (PIN or built-in).
    pub user_verified: bool,
}

/// The messages between this library and `dirseal-fido2` (crate::sys::helper's framing).
#[doc(hidden)]
pub mod wire {
    use serde::{Deserialize, Serialize};

    use super::{
        AssertRequest, Assertion, AuthenticatorInfo, CredentialRequest, DevicePath, Fido2Error, HidInfo, HmacSecret,
        Pin,
    };
    use crate::sys::helper::WireSecret;

    /// One request.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub enum Request {
        /// The HID authenticators libfido2 finds.
        ListHid,
        /// Open this device, bounding every later operation by the timeout.
        Open { path: DevicePath, timeout_ms: u64 },
        /// A new timeout for the open device.
        SetTimeout { timeout_ms: u64 },
        /// CTAP getInfo.
        Info,
        /// PIN tries left.
        PinRetries,
        /// Set (no `old`) or change the PIN.
        SetPin { new: WireSecret, old: Option<WireSecret> },
        /// A new credential.
        MakeCredential(MakeCredential),
        /// An assertion (with a salt: the hmac-secret).
        Assert(Assert),
    }

    /// One answer.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub enum Reply {
        /// To `ListHid`.
        Hid(Vec<HidInfo>),
        /// To `Open`, `SetTimeout`, `SetPin`.
        Done,
        /// To `Info`.
        Info(AuthenticatorInfo),
        /// To `PinRetries`.
        Retries(u32),
        /// To `MakeCredential`: the credential id.
        Credential(Vec<u8>),
        /// To `Assert`.
        Assertion(AssertionReply),
    }

    /// A request's outcome.
    pub type Response = Result<Reply, Fido2Error>;

    /// A [`CredentialRequest`] as it travels.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct MakeCredential {
        rp_id: String,
        user_id: Vec<u8>,
        user_name: String,
        pin: Option<WireSecret>,
        uv: bool,
    }

    impl MakeCredential {
        /// The library's side: the request, to send.
        pub fn new(req: &CredentialRequest<'_>) -> MakeCredential {
            MakeCredential {
                rp_id: req.rp_id.into(),
                user_id: req.user_id.to_vec(),
                user_name: req.user_name.into(),
                pin: req.pin.map(Pin::wire),
                uv: req.uv,
            }
        }

        /// The helper's side: the request as the library made it, given to `make` (the key).
        pub fn answer<T>(
            &self,
            make: impl FnOnce(&CredentialRequest<'_>) -> Result<T, Fido2Error>,
        ) -> Result<T, Fido2Error> {
            let pin = self.pin.as_ref().map(Pin::from_wire).transpose()?;
            let (rp_id, user_id, user_name) = (&self.rp_id, &self.user_id, &self.user_name);
            make(&CredentialRequest { rp_id, user_id, user_name, pin: pin.as_ref(), uv: self.uv })
        }
    }

    /// An [`AssertRequest`] as it travels.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Assert {
        rp_id: String,
        credential_ids: Vec<Vec<u8>>,
        salt: Option<[u8; 32]>,
        pin: Option<WireSecret>,
        uv: bool,
    }

    impl Assert {
        /// The library's side: the request, to send.
        pub fn new(req: &AssertRequest<'_>) -> Assert {
            Assert {
                rp_id: req.rp_id.into(),
                credential_ids: req.credential_ids.iter().map(|c| c.to_vec()).collect(),
                salt: req.salt.copied(),
                pin: req.pin.map(Pin::wire),
                uv: req.uv,
            }
        }

        /// The helper's side: the request as the library made it, given to `assert` (the key).
        pub fn answer(
            &self,
            assert: impl FnOnce(&AssertRequest<'_>) -> Result<Assertion, Fido2Error>,
        ) -> Result<Assertion, Fido2Error> {
            let pin = self.pin.as_ref().map(Pin::from_wire).transpose()?;
            let ids: Vec<&[u8]> = self.credential_ids.iter().map(Vec::as_slice).collect();
            let (salt, uv) = (self.salt.as_ref(), self.uv);
            assert(&AssertRequest { rp_id: &self.rp_id, credential_ids: &ids, salt, pin: pin.as_ref(), uv })
        }
    }

    /// An [`Assertion`] as it travels back.
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct AssertionReply {
        credential_id: Vec<u8>,
        secret: Option<WireSecret>,
        user_verified: bool,
    }

    impl From<Assertion> for AssertionReply {
        fn from(a: Assertion) -> AssertionReply {
            let secret = a.secret.map(|s| WireSecret::new(s.as_bytes()));
            AssertionReply { credential_id: a.credential_id, secret, user_verified: a.user_verified }
        }
    }

    impl AssertionReply {
        /// The assertion as the helper had it.
        pub fn assertion(self) -> Result<Assertion, Fido2Error> {
            let AssertionReply { credential_id, secret, user_verified } = self;
            let secret = secret.map(|s| HmacSecret::from_slice(s.as_bytes())).transpose()?;
            Ok(Assertion { credential_id, secret, user_verified })
        }
    }
}

use wire::{Reply, Request};

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn call(s: &mut Session, req: &Request, timeout: Duration) -> Result<Reply, Fido2Error> {
    s.call::<_, wire::Response>(req, timeout)?
}

fn unexpected() -> Fido2Error {
    Fido2Error::Helper("the security key helper answered out of turn".into())
}

/// Authenticators libfido2 finds on the HID bus.
pub(crate) fn list_hid() -> Result<Vec<HidInfo>, Fido2Error> {
    let mut s = Session::start(Helper::Fido2)?;
    match call(&mut s, &Request::ListHid, HELPER_GRACE)? {
        Reply::Hid(v) => Ok(v),
        _ => Err(unexpected()),
    }
}

/// An open authenticator, held by a `dirseal-fido2` helper of its own.
pub struct Device {
    s: Session,
    timeout: Duration,
}

impl Device {
    /// Opens `path` (CTAPHID INIT and getInfo); `timeout` bounds every later operation,
    /// including the wait for a touch.
    pub fn open(path: &DevicePath, timeout: Duration) -> Result<Device, Fido2Error> {
        let mut s = Session::start(Helper::Fido2)?;
        let req = Request::Open { path: path.clone(), timeout_ms: ms(timeout) };
        match call(&mut s, &req, SOCKET_SILENCE_CAP.max(timeout) + HELPER_GRACE)? {
            Reply::Done => Ok(Device { s, timeout }),
            _ => Err(unexpected()),
        }
    }

    fn call(&mut self, req: &Request) -> Result<Reply, Fido2Error> {
        call(&mut self.s, req, self.timeout + HELPER_GRACE)
    }

    /// Bounds every later operation, the wait for a touch included.
    pub(crate) fn set_timeout(&mut self, timeout: Duration) -> Result<(), Fido2Error> {
        match self.call(&Request::SetTimeout { timeout_ms: ms(timeout) })? {
            Reply::Done => {
                self.timeout = timeout;
                Ok(())
            }
            _ => Err(unexpected()),
        }
    }

    /// Asks the key what it is and what it supports (CTAP getInfo).
    pub fn info(&mut self) -> Result<AuthenticatorInfo, Fido2Error> {
        match self.call(&Request::Info)? {
            Reply::Info(i) => Ok(i),
            _ => Err(unexpected()),
        }
    }

    /// PIN tries left before the key blocks its PIN.
    pub fn pin_retries(&mut self) -> Result<u32, Fido2Error> {
        match self.call(&Request::PinRetries)? {
            Reply::Retries(n) => Ok(n),
            _ => Err(unexpected()),
        }
    }

    /// Sets the PIN (`old` = None) or changes it.
    pub fn set_pin(&mut self, new: &Pin, old: Option<&Pin>) -> Result<(), Fido2Error> {
        match self.call(&Request::SetPin { new: new.wire(), old: old.map(Pin::wire) })? {
            Reply::Done => Ok(()),
            _ => Err(unexpected()),
        }
    }

    /// A non-resident ES256 credential with hmac-secret for `rp_id`; waits for a touch.
    /// Returns the credential id.
    pub fn make_credential(
        &mut self,
        rp_id: &str,
        user_id: &[u8],
        user_name: &str,
        pin: Option<&Pin>,
        uv: bool,
    ) -> Result<Vec<u8>, Fido2Error> {
        let req = CredentialRequest { rp_id, user_id, user_name, pin, uv };
        match self.call(&Request::MakeCredential(wire::MakeCredential::new(&req)))? {
            Reply::Credential(id) => Ok(id),
            _ => Err(unexpected()),
        }
    }

    /// An assertion over the credentials listed; with a salt, waits for a touch and returns the
    /// hmac-secret; without, asks for no touch and only says which credential the key holds.
    pub fn assert(&mut self, req: &AssertRequest<'_>) -> Result<Assertion, Fido2Error> {
        match self.call(&Request::Assert(wire::Assert::new(req)))? {
            Reply::Assertion(a) => a.assertion(),
            _ => Err(unexpected()),
        }
    }
}
