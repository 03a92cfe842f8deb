//! The only unsafe code of the PAM module: libpam's C API, declared once, each call wrapped in
//! one safe method of [`Pam`].
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use dirseal::secret::{MasterKey, Passphrase};

use crate::session::Entry;
use zeroize::Zeroizing;

pub const PAM_SUCCESS: c_int = 0;
pub const PAM_AUTH_ERR: c_int = 7;
pub const PAM_AUTHTOK_ERR: c_int = 20;
pub const PAM_SERVICE_ERR: c_int = 3;
pub const PAM_PERM_DENIED: c_int = 6;
pub const PAM_SESSION_ERR: c_int = 14;
pub const PAM_CONV_ERR: c_int = 19;
pub const PAM_IGNORE: c_int = 25;

pub const PAM_SILENT: c_int = 0x8000;
/// pamsm's flag type lacks these two; they are plain bits of `flags` (<security/pam_modules.h>).
pub const PAM_PRELIM_CHECK: c_int = 0x4000;
pub const PAM_UPDATE_AUTHTOK: c_int = 0x2000;

const PAM_CONV: c_int = 5;
pub const PAM_AUTHTOK: c_int = 6;
pub const PAM_OLDAUTHTOK: c_int = 7;
pub const PAM_SERVICE: c_int = 1;
pub const PAM_TTY: c_int = 3;
pub const PAM_RHOST: c_int = 4;

const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_ERROR_MSG: c_int = 3;
const PAM_TEXT_INFO: c_int = 4;

pub const LOG_ERR: c_int = 3;
pub const LOG_WARNING: c_int = 4;
pub const LOG_NOTICE: c_int = 5;
pub const LOG_DEBUG: c_int = 7;

#[repr(C)]
pub struct PamHandleT {
    _opaque: [u8; 0],
}

#[repr(C)]
struct PamMessage {
    msg_style: c_int,
    msg: *const c_char,
}

#[repr(C)]
struct PamResponse {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn = unsafe extern "C" fn(c_int, *mut *const PamMessage, *mut *mut PamResponse, *mut c_void) -> c_int;

#[repr(C)]
struct PamConv {
    conv: Option<ConvFn>,
    appdata_ptr: *mut c_void,
}

type CleanupFn = unsafe extern "C" fn(*mut PamHandleT, *mut c_void, c_int);

#[link(name = "pam")]
extern "C" {
    fn pam_get_user(pamh: *mut PamHandleT, user: *mut *const c_char, prompt: *const c_char) -> c_int;
    fn pam_get_item(pamh: *const PamHandleT, item_type: c_int, item: *mut *const c_void) -> c_int;
    fn pam_set_item(pamh: *mut PamHandleT, item_type: c_int, item: *const c_void) -> c_int;
    fn pam_set_data(pamh: *mut PamHandleT, name: *const c_char, data: *mut c_void, cleanup: Option<CleanupFn>)
        -> c_int;
    fn pam_get_data(pamh: *const PamHandleT, name: *const c_char, data: *mut *const c_void) -> c_int;
    fn pam_syslog(pamh: *const PamHandleT, priority: c_int, fmt: *const c_char, ...);
}

/// Module arguments as Rust strings (invalid UTF-8 is replaced, then rejected as unknown).
///
/// # Safety
/// `argv` must be null or point to `argc` pointers, each null or a NUL-terminated string, valid
/// for the duration of the call (what libpam passes to an entry point).
unsafe fn args(argc: c_int, argv: *const *const c_char) -> Vec<String> {
    if argv.is_null() || argc <= 0 {
        return Vec::new();
    }
    (0..argc as usize)
        .filter_map(|i| {
            // SAFETY: the caller guarantees `argc` readable pointers in `argv`: `i` is in bounds.
            let at = unsafe { argv.add(i) };
            // SAFETY: in bounds (above), readable and aligned (libpam's array).
            let p = unsafe { *at };
            // SAFETY: non-null pointers in argv are NUL-terminated C strings owned by libpam.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}

/// A borrowed PAM handle, valid for one entry-point call.
pub struct Pam {
    h: *mut PamHandleT,
}

/// Frees (and zeroizes, for a master key) a value stored with `pam_set_data`.
unsafe extern "C" fn drop_boxed<T>(_h: *mut PamHandleT, data: *mut c_void, _status: c_int) {
    if !data.is_null() {
        // SAFETY: `data` came from Box::into_raw(Box<T>) in `set_boxed::<T>`, and libpam calls
        // the cleanup exactly once per stored pointer.
        drop(unsafe { Box::from_raw(data.cast::<T>()) });
    }
}

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

impl Pam {
    /// # Safety
    /// `h` must be the handle libpam passed to the running entry point; the `Pam` must not
    /// outlive that call.
    unsafe fn new(h: *mut PamHandleT) -> Option<Pam> {
        (!h.is_null()).then_some(Pam { h })
    }

    pub fn log(&self, priority: c_int, msg: &str) {
        let m = cstring(msg);
        // SAFETY: the format is a literal "%s" consuming exactly one NUL-terminated string.
        unsafe { pam_syslog(self.h, priority, c"%s".as_ptr(), m.as_ptr()) };
    }

    pub fn user(&self) -> Option<String> {
        let mut p: *const c_char = ptr::null();
        // SAFETY: valid handle; libpam stores a pointer to its own string in `p`.
        let r = unsafe { pam_get_user(self.h, &mut p, ptr::null()) };
        if r != PAM_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: on success `p` is a NUL-terminated string owned by libpam.
        let s = unsafe { CStr::from_ptr(p) };
        s.to_str().ok().map(str::to_owned)
    }

    /// A string item (PAM_SERVICE, PAM_RHOST); `None` when unset or not UTF-8.
    pub fn item(&self, item: c_int) -> Option<String> {
        let mut p: *const c_void = ptr::null();
        // SAFETY: valid handle and item type; libpam writes a pointer it owns.
        let r = unsafe { pam_get_item(self.h, item, &mut p) };
        if r != PAM_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: PAM_SERVICE and PAM_RHOST are NUL-terminated strings owned by libpam.
        let s = unsafe { CStr::from_ptr(p.cast::<c_char>()) };
        s.to_str().ok().map(str::to_owned)
    }

    /// PAM_AUTHTOK or PAM_OLDAUTHTOK, copied into a zeroizing buffer.
    pub fn authtok(&self, item: c_int) -> Option<Passphrase> {
        let mut p: *const c_void = ptr::null();
        // SAFETY: valid handle and item type; libpam writes a pointer it owns.
        let r = unsafe { pam_get_item(self.h, item, &mut p) };
        if r != PAM_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: authentication token items are NUL-terminated strings.
        let bytes = unsafe { CStr::from_ptr(p.cast::<c_char>()) }.to_bytes();
        Some(Passphrase::new(Zeroizing::new(bytes.to_vec())))
    }

    /// Sets PAM_AUTHTOK (libpam keeps its own copy, which it wipes when replaced or freed).
    pub fn set_authtok(&self, token: &Passphrase) -> bool {
        if token.as_bytes().contains(&0) {
            return false;
        }
        let mut c = Zeroizing::new(token.as_bytes().to_vec());
        c.push(0);
        // SAFETY: valid handle; `c` is NUL-terminated and outlives the call, which copies it.
        unsafe { pam_set_item(self.h, PAM_AUTHTOK, c.as_ptr().cast()) == PAM_SUCCESS }
    }

    fn converse(&self, style: c_int, text: &str) -> Result<Option<Passphrase>, c_int> {
        let mut conv: *const c_void = ptr::null();
        // SAFETY: valid handle; PAM_CONV yields a pointer to the application's pam_conv.
        let r = unsafe { pam_get_item(self.h, PAM_CONV, &mut conv) };
        if r != PAM_SUCCESS || conv.is_null() {
            return Err(PAM_CONV_ERR);
        }
        // SAFETY: PAM_CONV items point to a struct pam_conv that outlives this call.
        let conv = unsafe { &*conv.cast::<PamConv>() };
        let Some(f) = conv.conv else { return Err(PAM_CONV_ERR) };
        let text = cstring(text);
        let msg = PamMessage { msg_style: style, msg: text.as_ptr() };
        let mut msgp: *const PamMessage = &msg;
        let mut resp: *mut PamResponse = ptr::null_mut();
        // SAFETY: one message, as the conversation protocol requires; the callee allocates
        // `resp` with malloc (or leaves it null).
        let r = unsafe { f(1, &mut msgp, &mut resp, conv.appdata_ptr) };
        if resp.is_null() {
            return if r == PAM_SUCCESS { Ok(None) } else { Err(PAM_CONV_ERR) };
        }
        // `resp` points to one malloc'd pam_response whose `resp` string, if any, is a malloc'd
        // NUL-terminated string that we own now.
        // SAFETY: `resp` is non-null (checked) and points to a pam_response.
        let s = unsafe { (*resp).resp };
        let answer = (!s.is_null()).then(|| {
            // SAFETY: a non-null `resp` string is NUL-terminated.
            let len = unsafe { libc::strlen(s) };
            // SAFETY: `len` bytes before the NUL are readable, and nothing else holds them.
            let bytes = unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) };
            let copy = Passphrase::new(Zeroizing::new(bytes.to_vec()));
            // Wipe the application's copy before freeing it.
            // SAFETY: the same `len` writable bytes (malloc'd, ours now).
            unsafe { ptr::write_bytes(s, 0, len) };
            // SAFETY: malloc'd by the application for us to free, freed once.
            unsafe { libc::free(s.cast()) };
            copy
        });
        // SAFETY: malloc'd by the application for us to free, freed once (after its string).
        unsafe { libc::free(resp.cast()) };
        if r != PAM_SUCCESS {
            return Err(PAM_CONV_ERR);
        }
        Ok(answer)
    }

    /// Asks the user for a secret (not echoed); `None` when the application answered nothing.
    pub fn prompt_secret(&self, text: &str) -> Result<Option<Passphrase>, c_int> {
        self.converse(PAM_PROMPT_ECHO_OFF, text)
    }

    pub fn error_msg(&self, text: &str) {
        let _ = self.converse(PAM_ERROR_MSG, text);
    }

    pub fn info_msg(&self, text: &str) {
        let _ = self.converse(PAM_TEXT_INFO, text);
    }

    /// Keeps `key` for the session entry points; libpam zeroizes and frees it via the cleanup.
    pub fn set_master(&self, name: &CStr, key: MasterKey) -> bool {
        self.set_boxed(name, key)
    }

    /// A copy of the key stored by `set_master`, if any.
    pub fn master(&self, name: &CStr) -> Option<MasterKey> {
        // SAFETY: only `set_master` stores data under the names it is given.
        unsafe { self.get_boxed::<MasterKey, _>(name, MasterKey::duplicate) }
    }

    /// Keeps a secret for a later stack of this transaction (zeroized when libpam frees it).
    pub fn set_secret(&self, name: &CStr, secret: Passphrase) -> bool {
        self.set_boxed(name, secret)
    }

    /// A copy of the secret stored by `set_secret`, if any.
    pub fn secret(&self, name: &CStr) -> Option<Passphrase> {
        // SAFETY: only `set_secret` stores data under the names it is given.
        unsafe { self.get_boxed::<Passphrase, _>(name, Passphrase::duplicate) }
    }

    /// Drops the stored key now (after it has been handed to the kernel).
    pub fn clear_master(&self, name: &CStr) {
        // SAFETY: replacing the data runs the cleanup of the old pointer; null data has no cleanup.
        unsafe { pam_set_data(self.h, name.as_ptr(), ptr::null_mut(), None) };
    }

    /// Keeps the session `open_session` recorded, for `close_session` (possibly in a forked
    /// child, which shares the handle).
    pub fn set_session(&self, name: &CStr, e: Entry) -> bool {
        self.set_boxed(name, e)
    }

    pub fn session(&self, name: &CStr) -> Option<Entry> {
        // SAFETY: only `set_session` stores data under the names it is given.
        unsafe { self.get_boxed::<Entry, _>(name, |e| *e) }
    }

    /// Marks `name` as done for the rest of this PAM transaction.
    pub fn set_flag(&self, name: &CStr) -> bool {
        self.set_boxed(name, 1u8)
    }

    pub fn flag(&self, name: &CStr) -> bool {
        // SAFETY: only `set_flag` stores data under the names it is given.
        unsafe { self.get_boxed::<u8, _>(name, |_| ()) }.is_some()
    }

    /// Hands `value` to libpam under `name`, dropped (zeroized if its type does) by the cleanup.
    fn set_boxed<T: 'static>(&self, name: &CStr, value: T) -> bool {
        let raw = Box::into_raw(Box::new(value)).cast::<c_void>();
        // SAFETY: `raw` is a valid heap pointer whose ownership passes to libpam with the cleanup
        // for its own type.
        let r = unsafe { pam_set_data(self.h, name.as_ptr(), raw, Some(drop_boxed::<T>)) };
        if r != PAM_SUCCESS {
            // SAFETY: libpam did not take ownership, so we still own `raw`.
            drop(unsafe { Box::from_raw(raw.cast::<T>()) });
        }
        r == PAM_SUCCESS
    }

    /// # Safety
    /// Whatever is stored under `name` must have been stored by `set_boxed::<T>`.
    unsafe fn get_boxed<T, R>(&self, name: &CStr, f: impl FnOnce(&T) -> R) -> Option<R> {
        let mut p: *const c_void = ptr::null();
        // SAFETY: valid handle; `p` receives the pointer stored by `set_boxed`.
        let r = unsafe { pam_get_data(self.h, name.as_ptr(), &mut p) };
        if r != PAM_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: the caller guarantees the pointer is a live Box<T> owned by libpam.
        Some(f(unsafe { &*p.cast::<T>() }))
    }
}

// The exported entry points. `#[no_mangle]` counts as unsafe code, so they live here; each is
// only the panic guard around a safe handler in lib.rs.
macro_rules! entry {
    ($name:ident, $f:ident) => {
        #[no_mangle]
        pub extern "C" fn $name(pamh: *mut PamHandleT, flags: c_int, argc: c_int, argv: *const *const c_char) -> c_int {
            // SAFETY: libpam calls entry points with its live handle; `pam` is dropped on return.
            let Some(pam) = (unsafe { Pam::new(pamh) }) else { return PAM_SERVICE_ERR };
            // SAFETY: argc/argv are the module arguments libpam passes, valid during this call.
            let raw_args = || unsafe { args(argc, argv) };
            crate::guard(&pam, raw_args, crate::$f, flags)
        }
    };
}

entry!(pam_sm_authenticate, authenticate);
entry!(pam_sm_setcred, setcred);
entry!(pam_sm_acct_mgmt, acct_mgmt);
entry!(pam_sm_open_session, open_session);
entry!(pam_sm_close_session, close_session);
entry!(pam_sm_chauthtok, chauthtok);
