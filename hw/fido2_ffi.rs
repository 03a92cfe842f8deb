//! The only `unsafe` for FIDO2: a small safe face over libfido2 (through `libfido2-sys`, linked
//! against the system library).
//!
//! A device is either a real hidraw node found by libfido2's own enumeration, or a *socket
//! device*: an authenticator speaking CTAPHID reports over a unix stream socket, reached through
//! `fido_dev_set_io_functions`. Both go through the same libfido2 code from the CTAPHID INIT
//! handshake up, so tests against a software authenticator exercise the production path. Which
//! sockets count as devices is the caller's decision (dirseal takes them only from the root-owned
//! config); this module only refuses a socket not owned by root or by the caller's own uid.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uchar, c_void, CStr, CString};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant};

// The request and answer types are the library's, one definition for both ends of the pipe.
use dirseal::fido2::{
    AssertRequest, Assertion, AuthenticatorInfo, CredentialRequest, DevicePath, Fido2Error, HidInfo, HmacSecret, Pin,
    HMAC_SECRET_LEN, SOCKET_SILENCE_CAP,
};
use libfido2_sys as ffi;
use zeroize::Zeroizing;

/// A PIN as libfido2 takes it: NUL-terminated, wiped on drop; kept for as long as the call.
fn c_pin(p: Option<&Pin>) -> Option<Zeroizing<Vec<u8>>> {
    p.map(Pin::nul_terminated)
}

fn opt_ptr(p: &Option<Zeroizing<Vec<u8>>>) -> *const c_char {
    p.as_ref().map_or(std::ptr::null(), |v| v.as_ptr().cast())
}

fn strerr(code: c_int) -> String {
    // SAFETY: fido_strerr takes the code by value and only looks it up in a static table.
    let msg = unsafe { ffi::fido_strerr(code) };
    // SAFETY: for any code (unknown ones included) fido_strerr returns a non-NULL pointer to a
    // static NUL-terminated string, valid for the life of the program.
    unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
}

fn check(code: c_int) -> Result<(), Fido2Error> {
    match code {
        ffi::FIDO_OK => Ok(()),
        ffi::FIDO_ERR_PIN_INVALID => Err(Fido2Error::PinInvalid { retries: None }),
        ffi::FIDO_ERR_PIN_BLOCKED => Err(Fido2Error::PinBlocked),
        ffi::FIDO_ERR_PIN_AUTH_BLOCKED => Err(Fido2Error::PinAuthBlocked),
        ffi::FIDO_ERR_PIN_REQUIRED => Err(Fido2Error::PinRequired),
        ffi::FIDO_ERR_PIN_NOT_SET => Err(Fido2Error::PinNotSet),
        ffi::FIDO_ERR_PIN_POLICY_VIOLATION => Err(Fido2Error::PinPolicy),
        ffi::FIDO_ERR_NO_CREDENTIALS => Err(Fido2Error::NoCredential),
        ffi::FIDO_ERR_KEEPALIVE_CANCEL => Err(Fido2Error::Cancelled),
        ffi::FIDO_ERR_UNSUPPORTED_EXTENSION => Err(Fido2Error::Unsupported("the hmac-secret extension".into())),
        ffi::FIDO_ERR_UNSUPPORTED_OPTION | ffi::FIDO_ERR_INVALID_OPTION => {
            Err(Fido2Error::Unsupported("the requested option (user verification?)".into()))
        }
        c => Err(Fido2Error::Other { code: c, msg: strerr(c) }),
    }
}

/// libfido2 turns its debug log on when the environment has `FIDO_DEBUG`; in a PAM module the
/// environment is the caller's, and the log (CTAP frames) is not theirs to see: it goes nowhere.
unsafe extern "C" fn discard_log(_msg: *const c_char) {}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: fido_init takes its flags by value and only sets libfido2's global state (the
        // debug log among it); `call_once` runs it once, before any other libfido2 call.
        unsafe { ffi::fido_init(0) };
        // SAFETY: `discard_log` is a `'static` function of the handler's C signature that never
        // reads its argument, so libfido2 may call it at any time, from any thread.
        unsafe { ffi::fido_set_log_handler(Some(discard_log)) };
    });
}

/// Authenticators libfido2 finds on the HID bus.
pub fn list_hid() -> Result<Vec<HidInfo>, Fido2Error> {
    init();
    const MAX: usize = 64;
    // SAFETY: allocates MAX entries; freed below with the same count.
    let mut list = unsafe { ffi::fido_dev_info_new(MAX) };
    if list.is_null() {
        return Err(Fido2Error::Other { code: ffi::FIDO_ERR_INTERNAL, msg: "out of memory".into() });
    }
    let mut n = 0usize;
    // SAFETY: `list` holds MAX entries; libfido2 writes at most MAX and the count into `n`.
    let r = unsafe { ffi::fido_dev_info_manifest(list, MAX, &mut n) };
    let mut out = Vec::new();
    if r == ffi::FIDO_OK {
        for i in 0..n.min(MAX) {
            // SAFETY: `list` is live (freed only below) and i < n ≤ MAX: an entry that
            // fido_dev_info_manifest filled in.
            let di = unsafe { ffi::fido_dev_info_ptr(list, i) };
            // SAFETY: `di` is a filled entry of the live list; the getter returns its path string
            // (or NULL), owned by the list.
            let path = unsafe { ffi::fido_dev_info_path(di) };
            // SAFETY: as for the path: the entry's manufacturer string (or NULL).
            let manufacturer = unsafe { ffi::fido_dev_info_manufacturer_string(di) };
            // SAFETY: as for the path: the entry's product string (or NULL).
            let product = unsafe { ffi::fido_dev_info_product_string(di) };
            out.push(HidInfo {
                // SAFETY: `path` is NULL or the entry's NUL-terminated path, which `list` keeps
                // until it is freed below.
                path: unsafe { cstr(path) },
                // SAFETY: `manufacturer` is NULL or a NUL-terminated string kept by `list` until
                // it is freed below.
                manufacturer: unsafe { cstr(manufacturer) },
                // SAFETY: `product` is NULL or a NUL-terminated string kept by `list` until it is
                // freed below.
                product: unsafe { cstr(product) },
                // SAFETY: `di` is a filled entry of the live list; the getter returns a plain
                // integer read from it.
                vendor_id: unsafe { ffi::fido_dev_info_vendor(di) } as u16,
                // SAFETY: as for the vendor id: a plain integer read from the live entry.
                product_id: unsafe { ffi::fido_dev_info_product(di) } as u16,
            });
        }
    }
    // SAFETY: frees what fido_dev_info_new allocated, with the same count; sets `list` to NULL.
    unsafe { ffi::fido_dev_info_free(&mut list, MAX) };
    check(r)?;
    Ok(out)
}

/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-NULL and NUL-terminated per the contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The socket transport's per-open state, owned by libfido2 between open and close.
struct SocketIo {
    stream: UnixStream,
}

fn socket_open(path: &CStr) -> Option<Box<SocketIo>> {
    use std::os::unix::ffi::OsStrExt;
    let stream = UnixStream::connect(std::ffi::OsStr::from_bytes(path.to_bytes())).ok()?;
    Some(Box::new(SocketIo { stream }))
}

impl SocketIo {
    fn read_report(&mut self, buf: &mut [u8], ms: c_int) -> Option<usize> {
        let wait = if ms < 0 { SOCKET_SILENCE_CAP } else { Duration::from_millis(ms as u64) };
        let deadline = Instant::now() + wait;
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).ok()?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return None,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(got)
    }
}

unsafe extern "C" fn io_open(path: *const c_char) -> *mut c_void {
    let r = catch_unwind(|| {
        // SAFETY: libfido2 passes the NUL-terminated path given to fido_dev_open.
        let path = unsafe { CStr::from_ptr(path) };
        socket_open(path).map_or(std::ptr::null_mut(), |b| Box::into_raw(b).cast())
    });
    r.unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn io_close(h: *mut c_void) {
    // SAFETY: `h` came from Box::into_raw in io_open and libfido2 closes each handle once.
    let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(h.cast::<SocketIo>()) })));
}

unsafe extern "C" fn io_read(h: *mut c_void, buf: *mut c_uchar, len: usize, ms: c_int) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `h` came from Box::into_raw in io_open and stays live until io_close; libfido2
        // uses a handle from one thread at a time, so this is the only reference to it.
        let io = unsafe { &mut *h.cast::<SocketIo>() };
        // SAFETY: libfido2 passes its own report buffer: non-NULL, `len` writable bytes, not
        // otherwise accessed until we return.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        io.read_report(buf, ms).map_or(-1, |n| n as c_int)
    }));
    r.unwrap_or(-1)
}

unsafe extern "C" fn io_write(h: *mut c_void, buf: *const c_uchar, len: usize) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `h` came from Box::into_raw in io_open and stays live until io_close; libfido2
        // uses a handle from one thread at a time, so this is the only reference to it.
        let io = unsafe { &mut *h.cast::<SocketIo>() };
        // SAFETY: libfido2 passes the report to send: non-NULL, `len` readable bytes, not
        // modified until we return.
        let buf = unsafe { std::slice::from_raw_parts(buf, len) };
        // libfido2 prefixes each report with the HID report id (0), which is not sent on the wire.
        match buf.split_first() {
            Some((_, report)) if io.stream.write_all(report).is_ok() => len as c_int,
            _ => -1,
        }
    }));
    r.unwrap_or(-1)
}

/// An open authenticator.
pub struct Device {
    dev: *mut ffi::fido_dev_t,
    timeout: Duration,
}

impl Device {
    /// Opens `path` (CTAPHID INIT and getInfo); `timeout` bounds every later operation,
    /// including the wait for a touch.
    pub fn open(path: &DevicePath, timeout: Duration) -> Result<Device, Fido2Error> {
        init();
        let fail = |reason: String| Fido2Error::Open { path: path.to_string(), reason };
        let cpath = match path {
            DevicePath::Hid(p) => CString::new(p.as_bytes()),
            DevicePath::Socket(p) => {
                check_socket(p).map_err(fail)?;
                CString::new(p.as_os_str().as_encoded_bytes())
            }
        }
        .map_err(|_| fail("path holds a NUL byte".into()))?;
        // SAFETY: plain allocation; NULL checked; freed in Drop (or below on failure).
        let dev = unsafe { ffi::fido_dev_new() };
        if dev.is_null() {
            return Err(fail("out of memory".into()));
        }
        let mut d = Device { dev, timeout };
        if let DevicePath::Socket(_) = path {
            let io = ffi::fido_dev_io_t {
                open: Some(io_open),
                close: Some(io_close),
                read: Some(io_read),
                write: Some(io_write),
            };
            // SAFETY: `d.dev` is a fresh device; libfido2 copies the struct of function pointers.
            check(unsafe { ffi::fido_dev_set_io_functions(d.dev, &io) }).map_err(|e| fail(e.to_string()))?;
        }
        d.set_timeout(timeout).map_err(|e| fail(e.to_string()))?;
        // SAFETY: valid device and NUL-terminated path; libfido2 copies what it keeps.
        let r = unsafe { ffi::fido_dev_open(d.dev, cpath.as_ptr()) };
        if r != ffi::FIDO_OK {
            // Not open: Drop must not call fido_dev_close.
            // SAFETY: frees the never-opened device and NULLs the pointer.
            unsafe { ffi::fido_dev_free(&mut d.dev) };
            return Err(fail(strerr(r)));
        }
        // SAFETY: open device.
        if !unsafe { ffi::fido_dev_is_fido2(d.dev) } {
            return Err(fail("a U2F-only key (no FIDO2, no hmac-secret)".into()));
        }
        Ok(d)
    }

    /// Bounds every later operation, the wait for a touch included.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), Fido2Error> {
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: open device; any timeout value is accepted.
        check(unsafe { ffi::fido_dev_set_timeout(self.dev, ms) })?;
        self.timeout = timeout;
        Ok(())
    }

    /// Asks the key what it is and what it supports (CTAP getInfo).
    pub fn info(&mut self) -> Result<AuthenticatorInfo, Fido2Error> {
        let info = Owned::<ffi::fido_cbor_info_t>::new(
            // SAFETY: plain allocation, NULL-checked by Owned.
            unsafe { ffi::fido_cbor_info_new() },
            ffi::fido_cbor_info_free,
        )?;
        // SAFETY: open device, valid info object.
        check(unsafe { ffi::fido_dev_get_cbor_info(self.dev, info.0) })?;
        // The getters below only read `info` (live, filled in by the call above) and return its
        // lengths or pointers into arrays it owns, valid until it drops at the end of this function.
        let i = info.0;
        // SAFETY: `i` is the live, filled info object; returns its option-name array (or NULL).
        let names_p = unsafe { ffi::fido_cbor_info_options_name_ptr(i) };
        // SAFETY: `i` is the live, filled info object; returns the length of both option arrays.
        let options_len = unsafe { ffi::fido_cbor_info_options_len(i) };
        // SAFETY: `names_p` holds `options_len` NUL-terminated names (NULL when there are none),
        // owned by `info`, which outlives the copy.
        let names = unsafe { cstrs(names_p, options_len) };
        // SAFETY: `i` is the live, filled info object; returns the option values, one per name.
        let vals_p = unsafe { ffi::fido_cbor_info_options_value_ptr(i) };
        // SAFETY: `vals_p` holds `options_len` bools (the same length as the names) owned by
        // `info`, or is NULL when there are none.
        let vals = unsafe { copied(vals_p, options_len) };
        // SAFETY: `i` is the live, filled info object; returns its PIN protocol array (or NULL).
        let protos_p = unsafe { ffi::fido_cbor_info_protocols_ptr(i) };
        // SAFETY: `i` is the live, filled info object; returns the PIN protocol count.
        let protos_len = unsafe { ffi::fido_cbor_info_protocols_len(i) };
        // SAFETY: `i` is the live, filled info object; returns its version-string array (or NULL).
        let versions_p = unsafe { ffi::fido_cbor_info_versions_ptr(i) };
        // SAFETY: `i` is the live, filled info object; returns the version count.
        let versions_len = unsafe { ffi::fido_cbor_info_versions_len(i) };
        // SAFETY: `i` is the live, filled info object; returns its extension-name array (or NULL).
        let extensions_p = unsafe { ffi::fido_cbor_info_extensions_ptr(i) };
        // SAFETY: `i` is the live, filled info object; returns the extension count.
        let extensions_len = unsafe { ffi::fido_cbor_info_extensions_len(i) };
        Ok(AuthenticatorInfo {
            // SAFETY: `versions_p` holds `versions_len` NUL-terminated strings (NULL when there are
            // none) owned by `info`, alive until it drops after this copy.
            versions: unsafe { cstrs(versions_p, versions_len) },
            // SAFETY: `extensions_p` holds `extensions_len` NUL-terminated strings (NULL when there
            // are none) owned by `info`, alive until it drops after this copy.
            extensions: unsafe { cstrs(extensions_p, extensions_len) },
            options: names.into_iter().zip(vals).collect(),
            // SAFETY: `protos_p` holds `protos_len` bytes (NULL when there are none) owned by
            // `info`, alive until it drops after this copy.
            pin_protocols: unsafe { copied(protos_p, protos_len) },
        })
    }

    /// PIN tries left before the key blocks its PIN.
    pub fn pin_retries(&mut self) -> Result<u32, Fido2Error> {
        let mut n: c_int = 0;
        // SAFETY: open device; writes one int.
        check(unsafe { ffi::fido_dev_get_retry_count(self.dev, &mut n) })?;
        Ok(n.max(0) as u32)
    }

    /// Sets the PIN (`old` = None) or changes it.
    pub fn set_pin(&mut self, new: &Pin, old: Option<&Pin>) -> Result<(), Fido2Error> {
        let (new, old) = (c_pin(Some(new)), c_pin(old));
        // SAFETY: open device; NUL-terminated PINs (or NULL for no old PIN), alive for the call.
        let r = unsafe { ffi::fido_dev_set_pin(self.dev, opt_ptr(&new), opt_ptr(&old)) };
        let t = self.timed(r, Instant::now());
        self.with_retries(t)
    }

    /// A non-resident ES256 credential with hmac-secret for the request's relying party; waits
    /// for a touch. Returns the credential id.
    pub fn make_credential(&mut self, req: &CredentialRequest<'_>) -> Result<Vec<u8>, Fido2Error> {
        let CredentialRequest { rp_id, user_id, user_name, pin, uv } = *req;
        let bad = |_| Fido2Error::Other { code: ffi::FIDO_ERR_INVALID_ARGUMENT, msg: "NUL byte in a name".into() };
        let rp = CString::new(rp_id).map_err(bad)?;
        let name = CString::new(user_name).map_err(bad)?;
        // SAFETY: plain allocation, NULL-checked by Owned.
        let cred = Owned::<ffi::fido_cred_t>::new(unsafe { ffi::fido_cred_new() }, ffi::fido_cred_free)?;
        let cdh: [u8; 32] = rand::random();
        // SAFETY: `cred.0` is a live cred object (non-NULL, owned by `cred`); the type is a
        // plain int.
        check(unsafe { ffi::fido_cred_set_type(cred.0, ffi::COSE_ES256) })?;
        // SAFETY: live cred object; `cdh` is 32 readable bytes on our stack, copied by libfido2
        // before it returns.
        check(unsafe { ffi::fido_cred_set_clientdata_hash(cred.0, cdh.as_ptr(), cdh.len()) })?;
        // SAFETY: live cred object; `rp` is a NUL-terminated CString alive across the call (as id
        // and as name), which libfido2 duplicates.
        check(unsafe { ffi::fido_cred_set_rp(cred.0, rp.as_ptr(), rp.as_ptr()) })?;
        // SAFETY: live cred object; `user_id` is `user_id.len()` readable bytes and `name` a
        // NUL-terminated CString (name and display name), both alive across the call and copied
        // by libfido2; a NULL icon means none.
        check(unsafe {
            ffi::fido_cred_set_user(
                cred.0,
                user_id.as_ptr(),
                user_id.len(),
                name.as_ptr(),
                name.as_ptr(),
                std::ptr::null(),
            )
        })?;
        // SAFETY: live cred object; the extension mask is a plain int.
        check(unsafe { ffi::fido_cred_set_extensions(cred.0, ffi::FIDO_EXT_HMAC_SECRET) })?;
        // SAFETY: live cred object; the option is a plain enum value.
        check(unsafe { ffi::fido_cred_set_rk(cred.0, ffi::fido_opt_t_FIDO_OPT_OMIT) })?;
        if uv {
            // SAFETY: live cred object; the option is a plain enum value.
            check(unsafe { ffi::fido_cred_set_uv(cred.0, ffi::fido_opt_t_FIDO_OPT_TRUE) })?;
        }
        let start = Instant::now();
        let pin = c_pin(pin);
        // SAFETY: open device, prepared cred, NUL-terminated PIN or NULL, alive for the call.
        let r = unsafe { ffi::fido_dev_make_cred(self.dev, cred.0, opt_ptr(&pin)) };
        let t = self.timed(r, start);
        self.with_retries(t)?;
        // SAFETY: live cred object; returns a pointer to the credential id it holds (or NULL).
        let id_p = unsafe { ffi::fido_cred_id_ptr(cred.0) };
        // SAFETY: live cred object; returns the length of that id.
        let id_len = unsafe { ffi::fido_cred_id_len(cred.0) };
        // SAFETY: `id_p` is NULL or `id_len` bytes owned by `cred`, which outlives the copy.
        let id = unsafe { copied(id_p, id_len) };
        // SAFETY: valid cred object after a successful make_cred.
        let flags = unsafe { ffi::fido_cred_flags(cred.0) };
        const ED: u8 = 0x80;
        if id.is_empty() || flags & ED == 0 {
            return Err(Fido2Error::Unsupported("the hmac-secret extension".into()));
        }
        Ok(id)
    }

    /// An assertion over the credentials listed; with a salt, waits for a touch and returns the
    /// hmac-secret; without, asks for no touch and only says which credential the key holds.
    pub fn assert(&mut self, req: &AssertRequest<'_>) -> Result<Assertion, Fido2Error> {
        let rp = CString::new(req.rp_id)
            .map_err(|_| Fido2Error::Other { code: ffi::FIDO_ERR_INVALID_ARGUMENT, msg: "NUL in rp id".into() })?;
        // SAFETY: plain allocation, NULL-checked by Owned.
        let a = Owned::<ffi::fido_assert_t>::new(unsafe { ffi::fido_assert_new() }, ffi::fido_assert_free)?;
        let cdh: [u8; 32] = rand::random();
        let (up, uv) = match (req.salt.is_some(), req.uv) {
            (false, _) => (ffi::fido_opt_t_FIDO_OPT_FALSE, ffi::fido_opt_t_FIDO_OPT_OMIT),
            (true, true) if req.pin.is_none() => (ffi::fido_opt_t_FIDO_OPT_TRUE, ffi::fido_opt_t_FIDO_OPT_TRUE),
            (true, _) => (ffi::fido_opt_t_FIDO_OPT_TRUE, ffi::fido_opt_t_FIDO_OPT_OMIT),
        };
        // SAFETY: `a.0` is a live assert object (non-NULL, owned by `a`); `rp` is a
        // NUL-terminated CString alive across the call, which libfido2 duplicates.
        check(unsafe { ffi::fido_assert_set_rp(a.0, rp.as_ptr()) })?;
        // SAFETY: live assert object; `cdh` is 32 readable bytes on our stack, copied by libfido2.
        check(unsafe { ffi::fido_assert_set_clientdata_hash(a.0, cdh.as_ptr(), cdh.len()) })?;
        for id in req.credential_ids {
            // SAFETY: live assert object; `id` is `id.len()` readable bytes borrowed from the
            // request, copied by libfido2.
            check(unsafe { ffi::fido_assert_allow_cred(a.0, id.as_ptr(), id.len()) })?;
        }
        if let Some(salt) = req.salt {
            // SAFETY: live assert object; the extension mask is a plain int.
            check(unsafe { ffi::fido_assert_set_extensions(a.0, ffi::FIDO_EXT_HMAC_SECRET) })?;
            // SAFETY: live assert object; `salt` is `salt.len()` readable bytes borrowed from the
            // request, copied by libfido2.
            check(unsafe { ffi::fido_assert_set_hmac_salt(a.0, salt.as_ptr(), salt.len()) })?;
        }
        // SAFETY: live assert object; `up` is a plain enum value.
        check(unsafe { ffi::fido_assert_set_up(a.0, up) })?;
        // SAFETY: live assert object; `uv` is a plain enum value.
        check(unsafe { ffi::fido_assert_set_uv(a.0, uv) })?;
        let pin = c_pin(if req.salt.is_some() { req.pin } else { None });
        let start = Instant::now();
        // SAFETY: open device, prepared assert, NUL-terminated PIN or NULL, alive for the call.
        let r = unsafe { ffi::fido_dev_get_assert(self.dev, a.0, opt_ptr(&pin)) };
        let t = self.timed(r, start);
        self.with_retries(t)?;
        // SAFETY: live assert object; reads how many statements the key returned.
        if unsafe { ffi::fido_assert_count(a.0) } < 1 {
            return Err(Fido2Error::NoCredential);
        }
        // SAFETY: live assert object and statement 0 exists (count ≥ 1); returns a pointer to its
        // credential id (or NULL), owned by `a`.
        let id_p = unsafe { ffi::fido_assert_id_ptr(a.0, 0) };
        // SAFETY: live assert object, statement 0 exists; returns the length of that id.
        let id_len = unsafe { ffi::fido_assert_id_len(a.0, 0) };
        // SAFETY: `id_p` is NULL or `id_len` bytes owned by `a`, which outlives the copy.
        let credential_id = unsafe { copied(id_p, id_len) };
        // SAFETY: live assert object, statement 0 exists; returns its authenticator-data flags.
        let user_verified = unsafe { ffi::fido_assert_flags(a.0, 0) } & 0x04 != 0;
        let secret = if req.salt.is_some() {
            // SAFETY: live assert object, statement 0 exists; returns a pointer to its decrypted
            // hmac-secret output (or NULL), owned by `a`.
            let p = unsafe { ffi::fido_assert_hmac_secret_ptr(a.0, 0) };
            // SAFETY: live assert object, statement 0 exists; returns the length of that output.
            let n = unsafe { ffi::fido_assert_hmac_secret_len(a.0, 0) };
            if p.is_null() || n != HMAC_SECRET_LEN {
                return Err(Fido2Error::Unsupported("the hmac-secret extension".into()));
            }
            // SAFETY: `p` is non-NULL (checked) and points to `n` bytes owned by `a`, which
            // outlives the slice; HmacSecret copies them before `a` drops.
            Some(HmacSecret::from_slice(unsafe { std::slice::from_raw_parts(p, n) })?)
        } else {
            None
        };
        Ok(Assertion { credential_id, secret, user_verified })
    }

    /// Maps a failed read after the whole timeout to [`Fido2Error::Timeout`] (and tells the key
    /// to stop waiting for a touch).
    fn timed(&mut self, r: c_int, start: Instant) -> Result<(), Fido2Error> {
        let e = check(r);
        if matches!(r, ffi::FIDO_ERR_RX | ffi::FIDO_ERR_USER_ACTION_TIMEOUT | ffi::FIDO_ERR_ACTION_TIMEOUT)
            && (start.elapsed() + Duration::from_millis(200) >= self.timeout || r != ffi::FIDO_ERR_RX)
        {
            // SAFETY: open device; a CANCEL is harmless if nothing is pending.
            unsafe { ffi::fido_dev_cancel(self.dev) };
            return Err(Fido2Error::Timeout(self.timeout.as_secs().max(1)));
        }
        e
    }

    /// Fills in how many PIN tries are left after a wrong PIN.
    fn with_retries(&mut self, r: Result<(), Fido2Error>) -> Result<(), Fido2Error> {
        match r {
            Err(Fido2Error::PinInvalid { .. }) => Err(Fido2Error::PinInvalid { retries: self.pin_retries().ok() }),
            r => r,
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if !self.dev.is_null() {
            // SAFETY: a non-NULL `dev` is open (Device only exists opened; a failed open NULLs
            // it first) and is closed only here, once.
            unsafe { ffi::fido_dev_close(self.dev) };
            // SAFETY: `dev` came from fido_dev_new and is now closed; freed once, as
            // fido_dev_free sets the pointer to NULL.
            unsafe { ffi::fido_dev_free(&mut self.dev) };
        }
    }
}

/// Copies out an array libfido2 owns (a byte buffer, the option values, ...); NULL reads as empty.
///
/// # Safety
/// `p` is NULL or points to `n` initialised, aligned `T`s that stay valid and unmodified for the
/// call.
unsafe fn copied<T: Copy>(p: *const T, n: usize) -> Vec<T> {
    if p.is_null() {
        Vec::new()
    } else {
        // SAFETY: non-NULL (checked), so by the contract `n` initialised, aligned `T`s that
        // nothing writes to while the temporary slice lives.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }
}

/// Copies out an array of `n` strings libfido2 owns; NULL reads as empty.
///
/// # Safety
/// `p` is NULL or points to `n` pointers, each NULL or a NUL-terminated string; all stay valid
/// for the call.
unsafe fn cstrs(p: *const *mut c_char, n: usize) -> Vec<String> {
    // SAFETY: `p` is NULL or holds `n` readable pointers (the contract).
    let ptrs = unsafe { copied(p, n) };
    ptrs.into_iter()
        .map(|s| {
            // SAFETY: each pointer is NULL or a NUL-terminated string valid for the call (the
            // contract).
            unsafe { cstr(s) }
        })
        .collect()
}

/// A libfido2 object freed by its `*_free(&mut ptr)` function.
struct Owned<T>(*mut T, unsafe extern "C" fn(*mut *mut T));

impl<T> Owned<T> {
    fn new(p: *mut T, free: unsafe extern "C" fn(*mut *mut T)) -> Result<Owned<T>, Fido2Error> {
        if p.is_null() {
            return Err(Fido2Error::Other { code: ffi::FIDO_ERR_INTERNAL, msg: "out of memory".into() });
        }
        Ok(Owned(p, free))
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from the matching *_new function and is freed once.
        unsafe { (self.1)(&mut self.0) };
    }
}

/// A socket device must be a socket owned by root or by us: nobody else can put an
/// authenticator of their choosing in our path.
fn check_socket(p: &Path) -> Result<(), String> {
    let md = std::fs::symlink_metadata(p).map_err(|e| format!("{e}"))?;
    if !md.file_type().is_socket() {
        return Err("not a unix socket".into());
    }
    let me = rustix::process::geteuid().as_raw();
    if md.uid() != 0 && md.uid() != me {
        return Err(format!("the socket is owned by uid {}, not root", md.uid()));
    }
    Ok(())
}
