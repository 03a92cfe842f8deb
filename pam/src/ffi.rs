//! The only unsafe code of the PAM module: libpam's C API, declared once, each call wrapped in
//! one safe method of [`Pam`].
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use dirseal::secret::{MasterKey, Passphrase};
use zeroize::Zeroizing;

pub const PAM_SUCCESS: c_int = 0;
pub const PAM_SERVICE_ERR: c_int = 3;
pub const PAM_SYSTEM_ERR: c_int = 4;
pub const PAM_PERM_DENIED: c_int = 6;
pub const PAM_AUTH_ERR: c_int = 7;
pub const PAM_AUTHINFO_UNAVAIL: c_int = 9;
pub const PAM_USER_UNKNOWN: c_int = 10;
pub const PAM_SESSION_ERR: c_int = 14;
pub const PAM_CONV_ERR: c_int = 19;
pub const PAM_AUTHTOK_ERR: c_int = 20;
pub const PAM_AUTHTOK_RECOVERY_ERR: c_int = 21;
pub const PAM_IGNORE: c_int = 25;

pub const PAM_SILENT: c_int = 0x8000;
/// pamsm's flag type lacks these two; they are plain bits of `flags` (<security/pam_modules.h>).
pub const PAM_PRELIM_CHECK: c_int = 0x4000;
pub const PAM_UPDATE_AUTHTOK: c_int = 0x2000;

const PAM_CONV: c_int = 5;
pub const PAM_AUTHTOK: c_int = 6;
pub const PAM_OLDAUTHTOK: c_int = 7;

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
            // SAFETY: the caller guarantees `argc` readable pointers in `argv`.
            let p = unsafe { *argv.add(i) };
            // SAFETY: non-null pointers in argv are NUL-terminated C strings owned by libpam.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}

/// A borrowed PAM handle, valid for one entry-point call.
pub struct Pam {
    h: *mut PamHandleT,
}

/// Frees (and zeroizes) a master key stored with `pam_set_data`.
unsafe extern "C" fn drop_master(_h: *mut PamHandleT, data: *mut c_void, _status: c_int) {
    if !data.is_null() {
        // SAFETY: `data` came from Box::into_raw(Box<MasterKey>) in `set_master`, and libpam calls
        // the cleanup exactly once per stored pointer.
        drop(unsafe { Box::from_raw(data.cast::<MasterKey>()) });
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

    pub fn set_authtok(&self, item: c_int, pw: &Passphrase) -> bool {
        let mut buf = Zeroizing::new(Vec::with_capacity(pw.as_bytes().len() + 1));
        buf.extend_from_slice(pw.as_bytes());
        buf.push(0);
        if buf[..buf.len() - 1].contains(&0) {
            return false;
        }
        // SAFETY: libpam copies the NUL-terminated string before returning.
        unsafe { pam_set_item(self.h, item, buf.as_ptr().cast()) == PAM_SUCCESS }
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
        // SAFETY: `resp` points to one malloc'd pam_response whose `resp` string, if any, is a
        // malloc'd NUL-terminated string that we own now.
        let answer = unsafe {
            let s = (*resp).resp;
            let out = if s.is_null() {
                None
            } else {
                let len = libc::strlen(s);
                let bytes = std::slice::from_raw_parts(s.cast::<u8>(), len);
                let copy = Passphrase::new(Zeroizing::new(bytes.to_vec()));
                // Wipe the application's copy before freeing it.
                ptr::write_bytes(s, 0, len);
                libc::free(s.cast());
                Some(copy)
            };
            libc::free(resp.cast());
            out
        };
        if r != PAM_SUCCESS {
            return Err(PAM_CONV_ERR);
        }
        Ok(answer)
    }

    /// Asks for a secret without echo.
    pub fn prompt_secret(&self, text: &str) -> Result<Passphrase, c_int> {
        self.converse(PAM_PROMPT_ECHO_OFF, text)?.ok_or(PAM_CONV_ERR)
    }

    pub fn error_msg(&self, text: &str) {
        let _ = self.converse(PAM_ERROR_MSG, text);
    }

    pub fn info_msg(&self, text: &str) {
        let _ = self.converse(PAM_TEXT_INFO, text);
    }

    /// Keeps `key` for the session entry points; libpam zeroizes and frees it via the cleanup.
    pub fn set_master(&self, name: &CStr, key: MasterKey) -> bool {
        let raw = Box::into_raw(Box::new(key)).cast::<c_void>();
        // SAFETY: `raw` is a valid heap pointer whose ownership passes to libpam with its cleanup.
        let r = unsafe { pam_set_data(self.h, name.as_ptr(), raw, Some(drop_master)) };
        if r != PAM_SUCCESS {
            // SAFETY: libpam did not take ownership, so we still own `raw`.
            drop(unsafe { Box::from_raw(raw.cast::<MasterKey>()) });
        }
        r == PAM_SUCCESS
    }

    /// A copy of the key stored by `set_master`, if any.
    pub fn master(&self, name: &CStr) -> Option<MasterKey> {
        let mut p: *const c_void = ptr::null();
        // SAFETY: valid handle; `p` receives the pointer stored by `set_master`.
        let r = unsafe { pam_get_data(self.h, name.as_ptr(), &mut p) };
        if r != PAM_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: only `set_master` stores data under our names, always a Box<MasterKey>.
        Some(unsafe { &*p.cast::<MasterKey>() }.duplicate())
    }

    /// Drops the stored key now (after it has been handed to the kernel).
    pub fn clear_master(&self, name: &CStr) {
        // SAFETY: replacing the data runs the cleanup of the old pointer; null data has no cleanup.
        unsafe { pam_set_data(self.h, name.as_ptr(), ptr::null_mut(), None) };
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
