//! A software FIDO2 authenticator for tests: CTAP 2.1 (getInfo, clientPIN with PIN/UV auth
//! protocols 1 and 2, makeCredential, getAssertion, ES256, hmac-secret) behind CTAPHID framing,
//! served over a unix stream socket as a sequence of 64-byte reports — each connection is one
//! open of the device. Credentials are non-resident: the credential id is the private key and
//! hmac-secret seeds sealed (AES-256-GCM) under a key only this authenticator holds.
//!
//! User presence is what the test says it is: granted, withheld, or granted after a delay.
//!
//! Written for dirseal (MIT OR Apache-2.0) from the CTAP 2.1 specification.
mod ctap;
mod ctaphid;
mod pinproto;

use std::io;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use pinproto::Proto as PinProtocol;

/// What happens when a command needs the user to touch the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    Grant,
    /// Never touched: the authenticator sends keepalives until its own timeout or a CANCEL.
    Withhold,
    /// Touched this long after the authenticator starts asking.
    Delay(Duration),
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Advertised in getInfo, in order of preference.
    pub pin_protocols: Vec<PinProtocol>,
    /// CTAP 2.1 pinUvAuthToken (getPinUvAuthTokenUsingPinWithPermissions); off = a CTAP 2.0 key.
    pub token_permissions: bool,
    /// Built-in user verification (a fingerprint reader), granted together with presence.
    pub builtin_uv: bool,
    /// How long the authenticator itself waits for a touch before USER_ACTION_TIMEOUT.
    pub up_timeout: Duration,
    /// A PIN already set, as by the vendor's tool.
    pub pin: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            pin_protocols: vec![PinProtocol::Two, PinProtocol::One],
            token_permissions: true,
            builtin_uv: false,
            up_timeout: Duration::from_secs(30),
            pin: None,
        }
    }
}

pub(crate) struct Shared {
    auth: Mutex<ctap::Authenticator>,
    presence: Mutex<Presence>,
    presence_requests: AtomicUsize,
    touches: AtomicUsize,
    up_timeout: Duration,
    next_cid: AtomicU32,
    stop: AtomicBool,
}

/// A running authenticator; stops (and removes its socket) when dropped.
pub struct SoftFido {
    path: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SoftFido {
    /// Listens on a new unix socket at `path`.
    pub fn start(path: &Path, opts: Options) -> io::Result<SoftFido> {
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let mut auth = ctap::Authenticator::new(opts.clone());
        if let Some(pin) = &opts.pin {
            auth.set_pin_direct(pin);
        }
        let shared = Arc::new(Shared {
            auth: Mutex::new(auth),
            presence: Mutex::new(Presence::Grant),
            presence_requests: AtomicUsize::new(0),
            touches: AtomicUsize::new(0),
            up_timeout: opts.up_timeout,
            next_cid: AtomicU32::new(rand::random::<u32>() & 0x7fff_ffff | 1),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !sh.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let sh = sh.clone();
                        conns.push(std::thread::spawn(move || ctaphid::serve(s, sh)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        Ok(SoftFido { path: path.to_path_buf(), shared, thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn set_presence(&self, p: Presence) {
        *self.shared.presence.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }
    /// Commands that asked for a touch so far.
    pub fn presence_requests(&self) -> usize {
        self.shared.presence_requests.load(Ordering::SeqCst)
    }
    /// Touches given so far.
    pub fn touches(&self) -> usize {
        self.shared.touches.load(Ordering::SeqCst)
    }
    /// Unplug and plug back in (clears the three-wrong-PINs-per-power-up lock).
    pub fn power_cycle(&self) {
        self.shared.auth.lock().unwrap_or_else(|e| e.into_inner()).power_cycle();
    }
    /// Commands handled so far, one line each (see the crate docs); drains the log.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.shared.auth.lock().unwrap_or_else(|e| e.into_inner()).log)
    }
    pub fn pin_retries(&self) -> u8 {
        self.shared.auth.lock().unwrap_or_else(|e| e.into_inner()).pin_retries
    }
}

impl Drop for SoftFido {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
