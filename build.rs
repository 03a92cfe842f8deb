//! Writes the man pages (section 8) and shell completions of `dirseal` from its clap definition at
//! build time, next to the binaries: `TARGET/PROFILE/dirseal-docs/{man,completions}` (scripts/install.sh
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
    let extra = read(&Path::new(MAN).join("dirseal-extra.roff"))?;
    let mut entries = examples(&extra);
    entries.extend(examples(&read(&Path::new(MAN).join("examples.roff"))?));
    let mut cmd = args::Cli::command().disable_help_subcommand(true);
    cmd.build();
    write_pages(&cmd, &man, &entries)?;
    let top = man.join(format!("dirseal.{SECTION}"));
    let mut page = std::fs::read_to_string(&top).map_err(|e| at(&top, e))?;
    page.push_str(&extra);
    std::fs::write(&top, page).map_err(|e| at(&top, e))?;
    for name in ["dirsealed.8", "pam_dirseal.8"] {
        let path = man.join(name);
        std::fs::write(&path, read(&Path::new(MAN).join(name))?).map_err(|e| at(&path, e))?;
    }
    Ok(())
}

/// The manual section of dirseal's pages and its subcommands': it is installed in /usr/sbin, a
/// system administration command (Debian policy 12.1, hier(7)).
const SECTION: &str = "8";

/// An EXAMPLES entry (`.TP`, a tag line, its text) and the pages it goes to: every command its
/// tag line names in bold, `\fBdirseal policy list ...\fR` → `dirseal-policy-list`, and that
/// command's parent's page, `dirseal-policy`.
fn examples(roff: &str) -> Vec<(Vec<String>, String)> {
    let body = roff.split_once(".SH EXAMPLES\n").map_or(roff, |(_, b)| b);
    let body = body.split("\n.SH ").next().unwrap_or_default();
    let mut out = Vec::new();
    for entry in body.split(".TP\n").skip(1) {
        let tag = entry.lines().next().unwrap_or_default();
        let mut pages = Vec::new();
        for named in tag.split("\\fBdirseal ").skip(1) {
            let words: Vec<String> = named
                .split("\\fR")
                .next()
                .unwrap_or_default()
                .split(' ')
                .map(|w| w.replace("\\-", "-"))
                .take_while(|w| {
                    w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') && !w.starts_with('-')
                })
                .collect();
            for n in 1..=words.len().min(2) {
                pages.push(format!("dirseal-{}", words[..n].join("-")));
            }
        }
        out.push((pages, format!(".TP\n{entry}")));
    }
    out
}

/// A page for `cmd` and each of its subcommands, as clap_mangen writes them, in [`SECTION`], with
/// the option values in the SYNOPSIS (clap_mangen leaves them out) and their EXAMPLES.
fn write_pages(cmd: &clap::Command, dir: &Path, examples: &[(Vec<String>, String)]) -> Result<(), Box<dyn Error>> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, examples)?;
    }
    let source = format!("dirseal {}", std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    let man = clap_mangen::Man::new(cmd.clone()).section(SECTION).source(source);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    page.extend(synopsis(cmd).into_bytes());
    man.render_description_section(&mut page)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut page)?;
    }
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    // The top page's examples come with the rest of its hand-written sections.
    let mine: Vec<&str> =
        examples.iter().filter(|(pages, _)| pages.iter().any(|p| p == name)).map(|(_, e)| e.as_str()).collect();
    if !mine.is_empty() && name != "dirseal" {
        page.extend(b".SH EXAMPLES\n");
        for e in mine {
            page.extend(e.as_bytes());
        }
    }
    let path = dir.join(man.get_filename());
    std::fs::write(&path, page).map_err(|e| at(&path, e))?;
    Ok(())
}

/// The SYNOPSIS as clap_mangen writes it, with each option's value: `[\fB\-\-pcr\fR \fIN[,N...]\fR]`.
fn synopsis(cmd: &clap::Command) -> String {
    let esc = |s: &str| s.replace('\\', "\\e").replace('-', "\\-");
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let mut line = format!("\\fB{}\\fR ", esc(name));
    let value = |a: &clap::Arg| {
        let names: Vec<String> = a.get_value_names().map_or_else(
            || vec![a.get_id().as_str().to_uppercase()],
            |v| v.iter().map(|n| n.as_str().to_string()).collect(),
        );
        esc(&names.join(" "))
    };
    let (mut opts, pos): (Vec<_>, Vec<_>) =
        cmd.get_arguments().filter(|a| !a.is_hide_set()).partition(|a| !a.is_positional());
    opts.sort_by_key(|a| (a.get_short().is_none(), a.get_long().map(str::to_string)));
    for a in opts {
        let flag = match (a.get_short(), a.get_long()) {
            (Some(s), Some(l)) => format!("\\fB\\-{s}\\fR|\\fB\\-\\-{}\\fR", esc(l)),
            (Some(s), None) => format!("\\fB\\-{s}\\fR"),
            (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", esc(l)),
            (None, None) => continue,
        };
        let takes = a.get_num_args().is_some_and(|n| n.takes_values()) && a.get_action().takes_values();
        let val = if takes { format!(" \\fI{}\\fR", value(a)) } else { String::new() };
        let (l, r) = if a.is_required_set() { ("", "") } else { ("[", "]") };
        line.push_str(&format!("{l}{flag}{val}{r} "));
    }
    for a in pos {
        let (l, r) = if a.is_required_set() { ("<", ">") } else { ("[", "]") };
        line.push_str(&format!("{l}\\fI{}\\fR{r} ", value(a)));
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        let (l, r) = if cmd.is_subcommand_required_set() { ("<", ">") } else { ("[", "]") };
        line.push_str(&format!(
            "{l}\\fI{}\\fR{r}",
            cmd.get_subcommand_value_name().unwrap_or("command").to_lowercase()
        ));
    }
    format!(".SH SYNOPSIS\n{}\n", line.trim_end())
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
