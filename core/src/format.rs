//! The header every keystore record carries (`format`, `version`): one place decides which
//! versions this dirseal reads, for policy and protector files alike.

pub(crate) const FORMAT_VERSION: u32 = 1;

pub(crate) fn check_header(format: &str, version: u32, want: &str) -> Result<(), String> {
    if format != want {
        return Err(format!("format is {format:?}, expected {want:?}"));
    }
    if version != FORMAT_VERSION {
        return Err(format!("format version {version} is not supported by this dirseal (it reads version {FORMAT_VERSION}); use a matching dirseal"));
    }
    Ok(())
}
