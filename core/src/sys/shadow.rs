//! The shadow password database (`getspnam_r`) and libcrypt's `crypt_rn`: the only reader of
//! /etc/shadow in dirseal (the library's [`crate::account`] and the PAM module both use it).
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use zeroize::Zeroizing;

/// One shadow entry; the hash field stays in zeroizing memory.
pub(crate) struct RawShadow {
    pub(crate) hash: Zeroizing<Vec<u8>>,
    pub(crate) last_change: i64,
    pub(crate) max_days: i64,
    pub(crate) expire: i64,
}

/// The shadow entry of `user`; `Ok(None)` if there is none. Needs root.
pub(crate) fn getspnam(user: &str) -> Result<Option<RawShadow>, std::io::Error> {
    let name = CString::new(user).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut size = 4096;
    loop {
        // Zeroized on drop: it holds the password hash.
        let mut buf = Zeroizing::new(vec![0 as c_char; size]);
        // SAFETY: all-zero is a valid `spwd` (null pointers and integers); it is only read after
        // getspnam_r filled it.
        let mut sp: libc::spwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::spwd = ptr::null_mut();
        // SAFETY: `name` is NUL-terminated; `sp` and `buf` are writable and outlive the call,
        // which stores its strings in `buf` and points `result` at `sp` (or null).
        let rc = unsafe { libc::getspnam_r(name.as_ptr(), &mut sp, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if rc != 0 && rc != libc::ENOENT {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        if result.is_null() {
            return Ok(None);
        }
        let hash = if sp.sp_pwdp.is_null() {
            Zeroizing::new(Vec::new())
        } else {
            // SAFETY: on success `sp_pwdp` is a NUL-terminated string inside `buf`, alive here.
            Zeroizing::new(unsafe { CStr::from_ptr(sp.sp_pwdp) }.to_bytes().to_vec())
        };
        return Ok(Some(RawShadow { hash, last_change: sp.sp_lstchg, max_days: sp.sp_max, expire: sp.sp_expire }));
    }
}

#[link(name = "crypt")]
extern "C" {
    /// libxcrypt: hashes `phrase` with the method and salt of `setting` into `data` (a
    /// `struct crypt_data` of `size` bytes); null on failure.
    fn crypt_rn(phrase: *const c_char, setting: *const c_char, data: *mut c_void, size: c_int) -> *mut c_char;
}

/// `sizeof(struct crypt_data)` in libxcrypt is 32768; a larger buffer is accepted.
const CRYPT_DATA_SIZE: usize = 65536;

/// `crypt(phrase, setting)`: the hash of `phrase` in the form of `setting` (a shadow hash), or
/// `None` when libcrypt refuses (unknown method, a NUL in either).
pub(crate) fn crypt(phrase: &[u8], setting: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    let phrase = Zeroizing::new(CString::new(phrase).ok()?.into_bytes_with_nul());
    let setting = CString::new(setting).ok()?;
    // Zeroized on drop: it holds the phrase's hash and the method's scratch state. All-zero is
    // the initial state crypt_rn expects.
    let mut data = Zeroizing::new(vec![0u8; CRYPT_DATA_SIZE]);
    // SAFETY: both strings are NUL-terminated and alive; `data` is writable for its length,
    // which fits a c_int; the result points into `data` (or is null).
    let out = unsafe {
        crypt_rn(phrase.as_ptr().cast(), setting.as_ptr(), data.as_mut_ptr().cast(), CRYPT_DATA_SIZE as c_int)
    };
    if out.is_null() {
        return None;
    }
    // SAFETY: a non-null result is a NUL-terminated string inside `data`, alive here.
    let bytes = unsafe { CStr::from_ptr(out) }.to_bytes();
    // libxcrypt's failure token starts with '*' (it never is a valid hash).
    if bytes.first() == Some(&b'*') {
        return None;
    }
    Some(Zeroizing::new(bytes.to_vec()))
}
