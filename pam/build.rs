fn main() {
    // The PAM entry points call back into libpam (pam_get_user, pam_get_item, pam_syslog, ...).
    println!("cargo:rustc-link-lib=pam");
}
