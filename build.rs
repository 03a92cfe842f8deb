//! Writes the man pages and shell completions of `dirseal` from its clap definition at build time,
//! next to the binaries: `TARGET/PROFILE/dirseal-docs/{man,completions}` (scripts/install.sh
//! installs them from there; docs/architecture.md, "Man pages and completions"). clap knows the
//! commands and options; what a reader needs besides them (examples, the files, what the
//! encryption does and does not protect) is written by hand in src/cli/man, as are the pages of
//! the service and the PAM module, which have no clap definition here.
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::CommandFactory;
use clap_complete::Shell;

// The binary reads the fields; here only the definition counts.
#[allow(dead_code)]
#[path = "src/cli/args.rs"]
mod args;

/// What the definition takes from the library (src/cli/mod.rs gives it the library's own): the
/// same values, read from the library's sources, so that the build script needs no library.
/// tests/cli.rs checks them against the library.
mod lib_values {
    use std::sync::OnceLock;

    /// Parsed by the binary; here only a value's name and help are written.
    pub type KeyIdentifier = String;
    pub type ProtectorRef = String;

    pub(crate) static CONFIG_PATH: OnceLock<&'static str> = OnceLock::new();
    pub(crate) static SKEL_DIR: OnceLock<&'static str> = OnceLock::new();
    pub(crate) static KIND_NAMES: OnceLock<&'static [&'static str]> = OnceLock::new();
    pub(crate) static DEFAULT_KIND: OnceLock<&'static str> = OnceLock::new();

    pub fn config_path() -> &'static str {
        CONFIG_PATH.get().copied().unwrap_or_default()
    }

    pub fn kind_names() -> &'static [&'static str] {
        KIND_NAMES.get().copied().unwrap_or_default()
    }

    pub fn skel_dir() -> &'static str {
        SKEL_DIR.get().copied().unwrap_or_default()
    }

    pub fn default_kind() -> &'static str {
        DEFAULT_KIND.get().copied().unwrap_or_default()
    }
}

const MAN: &str = "src/cli/man";

fn main() -> Result<(), Box<dyn Error>> {
    for p in ["build.rs", "src/cli/args.rs", MAN, "core/src/config.rs", "core/src/home.rs", "core/src/protector/mod.rs"]
    {
        println!("cargo:rerun-if-changed={p}");
    }
    let config = leak(const_str("core/src/config.rs", "DEFAULT_CONFIG_PATH")?);
    let skel = leak(const_str("core/src/home.rs", "DEFAULT_SKEL")?);
    let kinds: &'static [&'static str] =
        Vec::leak(kind_names("core/src/protector/mod.rs")?.into_iter().map(leak).collect());
    set(&lib_values::CONFIG_PATH, config)?;
    set(&lib_values::SKEL_DIR, skel)?;
    set(&lib_values::KIND_NAMES, kinds)?;
    let default_kind = leak(const_str("core/src/protector/mod.rs", "DEFAULT_KIND")?);
    set(&lib_values::DEFAULT_KIND, default_kind)?;
    // For tests/cli.rs: what was read, and where the pages went.
    println!("cargo:rustc-env=DIRSEAL_DOCS_CONFIG_PATH={config}");
    println!("cargo:rustc-env=DIRSEAL_DOCS_SKEL={skel}");
    println!("cargo:rustc-env=DIRSEAL_DOCS_KIND_NAMES={}", kinds.join(","));
    println!("cargo:rustc-env=DIRSEAL_DOCS_DEFAULT_KIND={default_kind}");

    let out = docs_dir()?;
    println!("cargo:rustc-env=DIRSEAL_DOCS_DIR={}", out.display());
    // Written afresh: a page of a command that no longer exists must not be installed.
    match std::fs::remove_dir_all(&out) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(at(&out, e)),
        _ => {}
    }
    let (man, comp) = (out.join("man"), out.join("completions"));
    for d in [&man, &comp] {
        std::fs::create_dir_all(d).map_err(|e| at(d, e))?;
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut args::Cli::command(), "dirseal", &comp)?;
    }
    clap_mangen::generate_to(args::Cli::command(), &man)?;
    let top = man.join("dirseal.1");
    let mut page = std::fs::read_to_string(&top).map_err(|e| at(&top, e))?;
    page.push_str(&read(&Path::new(MAN).join("dirseal-extra.roff"))?);
    std::fs::write(&top, page).map_err(|e| at(&top, e))?;
    for name in ["dirsealed.8", "pam_dirseal.8"] {
        let path = man.join(name);
        std::fs::write(&path, read(&Path::new(MAN).join(name))?).map_err(|e| at(&path, e))?;
    }
    Ok(())
}

/// `TARGET/PROFILE/dirseal-docs`, beside the binaries. `OUT_DIR` is
/// `TARGET/PROFILE/build/dirseal-cli-HASH/out`; cargo does not name the profile's directory
/// otherwise, so it is found from there (as rage finds it), and the layout is checked.
fn docs_dir() -> Result<PathBuf, Box<dyn Error>> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("cargo set no OUT_DIR")?);
    let build = out.ancestors().nth(2).filter(|b| b.file_name().is_some_and(|n| n == "build"));
    let profile = build.and_then(Path::parent).ok_or_else(|| {
        format!("OUT_DIR {} is not TARGET/PROFILE/build/PACKAGE/out: where do the binaries go?", out.display())
    })?;
    Ok(profile.join("dirseal-docs"))
}

/// The value of `pub const NAME: &str = "...";` in `file`.
fn const_str(file: &str, name: &str) -> Result<String, Box<dyn Error>> {
    let text = read(Path::new(file))?;
    let start = format!("pub const {name}: &str = \"");
    text.lines()
        .find_map(|l| l.trim().strip_prefix(start.as_str())?.strip_suffix("\";").map(str::to_string))
        .ok_or_else(|| format!("{file}: no line `{start}...\";`").into())
}

/// The names the `kinds!` table registers, as `KIND_NAMES` lists them outside tests: an entry
/// under a `#[cfg(...)]` is not one (the only one there is test-only).
fn kind_names(file: &str) -> Result<Vec<String>, Box<dyn Error>> {
    let text = read(Path::new(file))?;
    let table = text.split_once("\nkinds! {\n").ok_or_else(|| format!("{file}: no `kinds! {{` table"))?.1;
    let table = table.split_once("\n}\n").ok_or_else(|| format!("{file}: the `kinds!` table does not end"))?.0;
    let (mut names, mut gated) = (Vec::new(), false);
    for line in table.lines().map(str::trim) {
        if line.starts_with("#[cfg(") {
            gated = true;
        } else if let Some(rest) = line.strip_prefix('"') {
            let name = rest.split_once('"').ok_or_else(|| format!("{file}: unreadable kind line {line:?}"))?.0;
            if !gated {
                names.push(name.to_string());
            }
            gated = false;
        }
    }
    if names.is_empty() {
        return Err(format!("{file}: the `kinds!` table names no kind").into());
    }
    Ok(names)
}

fn set<T: std::fmt::Debug>(cell: &OnceLock<T>, v: T) -> Result<(), Box<dyn Error>> {
    cell.set(v).map_err(|v| format!("set twice: {v:?}").into())
}

fn leak(s: String) -> &'static str {
    String::leak(s)
}

fn read(path: &Path) -> Result<String, Box<dyn Error>> {
    std::fs::read_to_string(path).map_err(|e| at(path, e))
}

fn at(path: &Path, e: std::io::Error) -> Box<dyn Error> {
    format!("{}: {e}", path.display()).into()
}
