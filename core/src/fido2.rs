//! Security keys (FIDO2 authenticators) as dirseal sees them: which are connected, what each
//! says of itself, and which one holds a given credential — found by an assertion that asks for
//! no touch, so only the right key ever blinks.
//!
//! Connected keys are libfido2's hidraw devices plus the *socket devices* the root-owned config
//! names (`[fido2] socket_devices`: software authenticators for tests and demos). Nothing a
//! caller passes can add a device: `--device` must name one of these.
use std::time::Duration;

use crate::config::Fido2Config;
pub use crate::sys::fido2::{AssertRequest, AuthenticatorInfo, Device, DevicePath, Fido2Error, Pin};

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
    let mut out: Vec<DevicePath> =
        crate::sys::fido2::list_hid()?.into_iter().map(|d| DevicePath::Hid(d.path)).collect();
    out.extend(cfg.socket_devices.iter().filter(|p| p.exists()).map(|p| DevicePath::Socket(p.clone())));
    Ok(out)
}

/// A connected key, for `dirseal fido2 list`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Connected {
    pub path: String,
    pub product: String,
    /// What the key said of itself; absent if it could not be opened (then `error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<AuthenticatorInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn list(cfg: &Fido2Config) -> Result<Vec<Connected>, Fido2Error> {
    let hid = crate::sys::fido2::list_hid()?;
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
        let probe = crate::sys::fido2::AssertRequest {
            rp_id,
            credential_ids: &[credential_id],
            salt: None,
            pin: None,
            uv: false,
        };
        if d.assert(&probe).is_ok() {
            d.set_timeout(cfg.touch_timeout())?;
            return Ok(d);
        }
    }
    Err(Fido2Error::NotConnected)
}
