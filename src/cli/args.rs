//! The command line, clap only: every command, flag and help text of `dirseal`. Self-contained so
//! that build.rs includes it too and writes the man pages and shell completions from it at build
//! time (docs/architecture.md, "Man pages and completions"). What it takes from the library, the
//! includer gives as `super::lib_values`: the binary the library's own (src/cli/mod.rs), build.rs
//! the same values read from the library's sources.
use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use super::lib_values::{config_path, default_kind, kind_names, skel_dir, KeyIdentifier, ProtectorRef};

#[derive(Parser)]
#[command(
    name = "dirseal",
    version,
    about = "Encrypt existing directories in place with Linux native filesystem encryption (fscrypt v2)",
    after_help = "Start with `dirseal convert DIR` to encrypt a directory that holds data, then `dirseal status DIR`. \
                  Run by a user other than root, dirseal asks the system service dirsealed, which acts only on the \
                  user's own directories and protectors (status, unlock, lock, change-password, protector, recovery, \
                  convert and decrypt); other commands need root."
)]
pub struct Cli {
    /// Config file
    #[arg(long, global = true, env = "DIRSEAL_CONFIG", default_value = config_path(), value_name = "FILE", help_heading = "Global options")]
    pub config: PathBuf,
    /// Keystore directory [default: from the config, else /var/lib/dirseal]
    #[arg(long, global = true, env = "DIRSEAL_KEYSTORE", value_name = "DIR", help_heading = "Global options")]
    pub keystore: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Show the system overview, or one directory: encrypted?, locked?, policy, protectors
    Status {
        /// A directory (any path) to report on; without it, every policy and protector
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Encrypt an empty directory (for one that holds data, use `convert`)
    Encrypt {
        /// The empty directory to encrypt
        dir: PathBuf,
        #[command(flatten)]
        protector: ProtectorArgs,
        #[command(flatten)]
        recovery: RecoveryOffer,
        /// Keep the directory's records on its own filesystem (removable media) so that it opens on
        /// any machine with its password or security key; a TPM protector cannot be its only one
        #[arg(long)]
        portable: bool,
    },
    /// Encrypt a directory that already holds data, in place (resumable)
    Convert(ConvertArgs),
    /// Turn an encrypted directory back into plaintext in place (the way back from `convert`):
    /// resumable, verified, atomic; its policy and the protectors only it used are removed
    Decrypt(DecryptArgs),
    /// Unlock an encrypted directory (load its key into the kernel)
    Unlock {
        /// The encrypted directory (any directory of its tree)
        dir: PathBuf,
        /// Protector to use when the directory has several (its id or name)
        #[arg(long, value_name = "ID|NAME", conflicts_with = "recovery")]
        protector: Option<ProtectorRef>,
        /// Unlock with the directory's recovery key (works without the keystore)
        #[arg(long)]
        recovery: bool,
        /// Print the result as one JSON object (path, unlocked, already_unlocked)
        #[arg(long)]
        json: bool,
    },
    /// Lock an encrypted directory (remove its key from the kernel)
    Lock {
        /// The encrypted directory (any directory of its tree: the whole tree is locked)
        dir: PathBuf,
        /// Also remove the key other users added
        #[arg(long)]
        all_users: bool,
        /// Print the outcome as JSON
        #[arg(long)]
        json: bool,
    },
    /// Change the password (or PIN) of a directory's protector
    ChangePassword {
        /// The encrypted directory whose protector's secret changes
        dir: PathBuf,
        /// Protector to change when the directory has several (its id or name)
        #[arg(long, value_name = "ID|NAME")]
        protector: Option<ProtectorRef>,
    },
    /// Manage protectors (what unwraps a directory's key)
    #[command(subcommand)]
    Protector(ProtectorCmd),
    /// Manage policies (one per encrypted directory) and their protectors
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Recovery keys: create, verify, remove, and restore access with one
    #[command(subcommand)]
    Recovery(RecoveryCmd),
    /// New accounts' homes, encrypted before anything is written to them
    #[command(subcommand)]
    Home(HomeCmd),
    /// The TPM: status and dictionary-attack (wrong PIN) protection
    #[command(subcommand)]
    Tpm2(Tpm2Cmd),
    /// Security keys (FIDO2): which are connected and what they support
    #[command(subcommand)]
    Fido2(Fido2Cmd),
    /// PIN-login accounts: log in with the TPM PIN alone, no password hash in /etc/shadow
    #[command(subcommand)]
    PinLogin(PinLoginCmd),
    /// Display managers' automatic login onto an encrypted home (handhelds): check, status
    #[command(subcommand)]
    Autologin(AutologinCmd),
    /// Overwrite a filesystem's free space (old plaintext of deleted or converted files), then TRIM
    Scrub(ScrubArgs),
    /// What a fleet agent collects: every encrypted directory (owner, locked?, protector kinds,
    /// recovery key, escrow), the TPM's lockout, unfinished conversions; asks nothing
    Report {
        /// Print one JSON object (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
    /// Unlock the directories `[tang] unlock_at_boot` names with their network (tang)
    /// protectors, asking nothing (what the opt-in dirseal-unlock-boot.service runs)
    UnlockAtBoot,
}

#[derive(Subcommand)]
// Parsed once per run: the kind options' size costs nothing, and boxing them would hide them from clap.
#[allow(clippy::large_enum_variant)]
pub enum ProtectorCmd {
    /// List every protector and the policies it protects
    List {
        /// Print JSON (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
    /// Create a protector (not yet attached to any policy)
    Create {
        /// The protector's name, shown in listings and prompts and accepted by --protector
        #[arg(long)]
        name: String,
        /// Kind of protector
        #[arg(long = "type", alias = "protector-type", default_value = default_kind(), value_parser = PossibleValuesParser::new(kind_names().iter().copied()))]
        protector_type: String,
        /// The user whose password this is
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        kdf: KdfArgs,
    },
    /// Delete a protector that no policy uses any more
    Remove {
        /// The protector's id or name (`dirseal protector list`)
        id: ProtectorRef,
    },
    /// Check a protector's secret without changing anything
    Verify {
        /// The protector's id or name (`dirseal protector list`)
        id: ProtectorRef,
    },
    /// Change a protector's password or PIN (no data is re-encrypted)
    ChangePassword {
        /// The protector's id or name (`dirseal protector list`)
        id: ProtectorRef,
    },
}

#[derive(Subcommand)]
pub enum PinLoginCmd {
    /// Make USER log in with their TPM PIN only: their password hash is removed, `passwd` changes the PIN
    Enable {
        /// The user (their TPM+PIN protector must open their home)
        user: String,
    },
    /// End USER's PIN login (the account keeps no password until `passwd USER` sets one)
    Disable {
        /// The user
        user: String,
    },
}

#[derive(Subcommand)]
// Parsed once per run: the kind options' size costs nothing, and boxing them would hide them from clap.
#[allow(clippy::large_enum_variant)]
pub enum PolicyCmd {
    /// List every policy, its key status and protectors
    List {
        /// Print JSON (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
    /// Let another protector (existing, or a new password) open a directory
    AddProtector {
        #[command(flatten)]
        target: PolicyTarget,
        /// Existing protector of the policy that proves access (asked for its secret), by id or name
        #[arg(long, value_name = "ID|NAME")]
        with: Option<ProtectorRef>,
        #[command(flatten)]
        new: ProtectorArgs,
    },
    /// Stop a protector from opening a directory (never the last usable one)
    RemoveProtector {
        #[command(flatten)]
        target: PolicyTarget,
        /// The protector that stops opening it, by id or name
        #[arg(long, value_name = "ID|NAME")]
        protector: ProtectorRef,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct PolicyTarget {
    /// The encrypted directory
    pub dir: Option<PathBuf>,
    /// The policy id (the key identifier), instead of a directory
    #[arg(long, value_name = "ID")]
    pub policy: Option<KeyIdentifier>,
}

#[derive(Args, Default)]
pub struct KdfArgs {
    /// Argon2id time for this protector, in ms of CPU (default: the calibrated machine cost)
    #[arg(long, value_name = "MS")]
    pub kdf_time_ms: Option<u64>,
    /// Argon2id memory for this protector, in MiB (default: min(RAM/8, 256))
    #[arg(long, value_name = "MIB")]
    pub kdf_memory_mib: Option<u32>,
    /// tpm2: no PIN; the TPM unseals for anyone who runs code as root here (see docs/tpm2.md)
    #[arg(long)]
    pub no_pin: bool,
    /// tpm2: refuse to unseal once these PCRs (SHA-256 bank) differ from their values now, e.g. 7
    #[arg(long, value_name = "N[,N...]")]
    pub pcr: Option<String>,
    /// FIDO2: the security key to use, as `dirseal fido2 list` shows it (needed if several)
    #[arg(long, value_name = "PATH")]
    pub device: Option<String>,
    /// FIDO2: require the security key's PIN at every unlock
    #[arg(long)]
    pub pin: bool,
    /// FIDO2: require the security key's built-in user verification (fingerprint)
    #[arg(long)]
    pub uv: bool,
    /// tang: the tang server's URL (http://HOST[:PORT]); unlocking works only while it answers
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// tang: the SHA-256 thumbprint of the server's signing key, as its tang-show-keys prints it (without it, the keys are shown for confirmation)
    #[arg(long, value_name = "THP")]
    pub thumbprint: Option<String>,
    /// tang: make the protector from this JWE made by `clevis encrypt tang` (its plaintext, 32 bytes, is the key)
    #[arg(long, value_name = "FILE")]
    pub import: Option<std::path::PathBuf>,
    /// tpm2: accept a PIN equal to the user's login password (its hash in /etc/shadow then lets anyone with the disk test the PIN offline)
    #[arg(long)]
    pub allow_password_pin: bool,
    /// An option of the protector's kind, by the name the kind gives it (KEY alone: KEY=true); the flags above are the same as --protector-opt no_pin, pcr=7, ...
    #[arg(long, value_name = "KEY[=VALUE]")]
    pub protector_opt: Vec<String>,
}

#[derive(Args, Default)]
pub struct ProtectorArgs {
    /// Protect with this existing protector (asks its secret), by id or name
    #[arg(long, value_name = "ID|NAME", conflicts_with_all = ["protector_name"])]
    pub protector: Option<ProtectorRef>,
    /// Kind of new protector to create
    #[arg(long, alias = "type", default_value = default_kind(), value_parser = PossibleValuesParser::new(kind_names().iter().copied()))]
    pub protector_type: String,
    /// Name of the new protector [default: the owner's user name ("uid N" without a passwd entry), else the kind]
    #[arg(long, value_name = "NAME")]
    pub protector_name: Option<String>,
    /// The user the directory and its new password protector belong to
    #[arg(long)]
    pub user: Option<String>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Args)]
#[command(
    mut_arg("force", |a| a.help("Convert even if programs use the directory (their changes during the copy are recopied)")),
    mut_arg("data_mode", |a| a.help("copy: a second copy next to the original (needs room for it); move: the data moves into the encrypted directory chunk by chunk (for a nearly full disk; no backup window); auto: copy when it fits, else move")),
    mut_arg("abort", |a| a.help("Before the swap: remove the copy, leave the original untouched")),
    mut_arg("rollback", |a| a.help("After a swap kept with --keep-backup: put the plaintext back")),
    mut_arg("commit", |a| a.help("After a swap kept with --keep-backup: delete the old plaintext")),
    mut_arg("status", |a| a.help("Show the recorded state of a conversion")),
)]
pub struct ConvertArgs {
    /// The directory to encrypt in place
    #[arg(required_unless_present_any = ["status", "scheduled"])]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub protector: ProtectorArgs,
    #[command(flatten)]
    pub recovery: RecoveryOffer,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Keep the directory's records on its own filesystem (removable media) so that it opens on
    /// any machine with its password or security key; a TPM protector cannot be its only one
    #[arg(long)]
    pub portable: bool,
    /// Keep the old plaintext until `--commit` (or restore it with `--rollback`)
    #[arg(long)]
    pub keep_backup: bool,
    /// Overwrite the old plaintext before deleting it, then TRIM the filesystem
    #[arg(long)]
    pub wipe: bool,
    /// When done, overwrite the filesystem's free space (`dirseal scrub`): the old plaintext and
    /// what files deleted earlier left behind
    #[arg(long)]
    pub scrub: bool,
    #[command(flatten)]
    pub run: RunArgs,
    /// Resume an interrupted conversion (what a plain re-run does too)
    #[arg(long, group = "mode")]
    pub resume: bool,
    /// Convert at the next boot, before the display manager: the password (or other protector)
    /// and the recovery key are asked now, nothing at boot; the home may stay in use until then.
    /// `--abort` cancels it
    #[arg(long, conflicts_with_all = ["portable", "scrub", "mode"])]
    pub at_next_boot: bool,
    /// Convert while the directory is in use (a logged-in home): the password (or other
    /// protector) and the recovery key are asked now; a background run (idle priority) copies
    /// and catches up with the changes, then commits once the owner has logged out and nothing
    /// uses the directory (a commit put off is retried after the next logout; the next boot
    /// commits it if none came). `--status DIR` shows where it stands, `--abort` cancels it
    #[arg(long, conflicts_with_all = ["portable", "scrub", "at_next_boot", "mode"])]
    pub live: bool,
    /// With --live: wait for the commit (after the owner's logout) before returning
    #[arg(long, requires = "live")]
    pub wait: bool,
    /// The background run of a conversion started with --live (what `convert --live` starts)
    #[arg(long, hide = true, conflicts_with_all = ["live", "at_next_boot", "mode"], requires = "dir")]
    pub live_worker: bool,
    /// Run every conversion scheduled with --at-next-boot, with their held keys (what
    /// dirseal-convert-boot.service runs at boot); progress on stdout and through plymouth
    #[arg(long, group = "mode", conflicts_with_all = ["dir", "at_next_boot"])]
    pub scheduled: bool,
    #[command(flatten)]
    pub end: EndArgs,
}

/// How the engine runs, either way; `convert` and `decrypt` word `--force` and `--mode` for their
/// direction (`mut_arg` on their own arguments).
#[derive(Args)]
pub struct RunArgs {
    #[arg(long)]
    pub force: bool,
    #[arg(long = "mode", value_enum, default_value = "auto", value_name = "MODE")]
    pub data_mode: DataMode,
    /// Worker threads [default: two per CPU, at least 4]
    #[arg(long, value_name = "N")]
    pub threads: Option<std::num::NonZeroUsize>,
    /// One JSON progress object per second on stdout, and a JSON result
    #[arg(long)]
    pub json: bool,
}

/// The ends of a recorded run, and a look at it; worded by each command for its direction.
#[derive(Args)]
pub struct EndArgs {
    #[arg(long, group = "mode")]
    pub abort: bool,
    #[arg(long, group = "mode")]
    pub rollback: bool,
    #[arg(long, group = "mode")]
    pub commit: bool,
    #[arg(long, group = "mode")]
    pub status: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DataMode {
    Copy,
    Move,
    Auto,
}

#[derive(Args)]
#[command(
    mut_arg("force", |a| a.help("Decrypt even if programs use the directory (their changes during the copy are recopied)")),
    mut_arg("data_mode", |a| a.help("copy: a plaintext copy next to the encrypted tree (needs room for it); move: the data moves out chunk by chunk (for a nearly full disk; no backup window); auto: copy when it fits, else move")),
    mut_arg("abort", |a| a.help("Before the swap: remove the plaintext copy, leave the encrypted directory untouched")),
    mut_arg("rollback", |a| a.help("After a swap kept with --keep-backup: put the encrypted tree back")),
    mut_arg("commit", |a| a.help("After a swap kept with --keep-backup: delete the encrypted tree and forget its keys")),
    mut_arg("status", |a| a.help("Show the recorded state of a decrypt")),
)]
pub struct DecryptArgs {
    /// The encrypted directory (the root of its policy) to turn back into plaintext in place
    pub dir: PathBuf,
    /// Unlock a locked directory (or reload its key to resume) with this protector, by id or name
    #[arg(long, value_name = "ID|NAME")]
    pub protector: Option<ProtectorRef>,
    /// Do not ask for confirmation
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Keep the encrypted tree until `--commit` (or put it back with `--rollback`)
    #[arg(long)]
    pub keep_backup: bool,
    /// Keep the protectors that protected only this directory (the policy record goes anyway)
    #[arg(long)]
    pub keep_protectors: bool,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub end: EndArgs,
}

#[derive(Subcommand)]
// Parsed once per run: the kind options' size costs nothing, and boxing them would hide them from clap.
#[allow(clippy::large_enum_variant)]
pub enum RecoveryCmd {
    /// Create a recovery key for DIR: shown once, to write down (asks for a protector's secret)
    Add {
        /// The encrypted directory (the top of its tree)
        dir: PathBuf,
        /// Protector that proves access when the directory has several (its id or name)
        #[arg(long, value_name = "ID|NAME")]
        protector: Option<ProtectorRef>,
    },
    /// Check a typed recovery key against DIR without unlocking anything
    Verify {
        /// The encrypted directory the key belongs to
        dir: PathBuf,
    },
    /// Delete DIR's recovery key (it stops working)
    Remove {
        /// The encrypted directory whose key is deleted
        dir: PathBuf,
    },
    /// Unlock DIR with its recovery key and enrol a new protector; works with a lost keystore
    Restore {
        /// The encrypted directory to open and give a new protector
        dir: PathBuf,
        #[command(flatten)]
        protector: ProtectorArgs,
    },
    /// Write DIR's escrow record again for the configured recipients (asks its recovery key, or
    /// opens its old record with --identity); --all with --identity: every record that identity
    /// opens; --check: list directories whose record is missing, damaged or for other recipients
    #[command(group = clap::ArgGroup::new("which").required(true).args(["dir", "all", "check"]))]
    Escrow {
        /// The encrypted directory whose recovery key is escrowed
        dir: Option<PathBuf>,
        /// Every directory with a recovery key whose record is not current (needs --identity)
        #[arg(long, requires = "identity")]
        all: bool,
        /// Only list what is not escrowed to the configured recipients (exit status 1 if any)
        #[arg(long, conflicts_with = "identity")]
        check: bool,
        /// An age identity file or unencrypted ssh private key that opens the old records
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
    },
}

/// `--recovery-key` / `--no-recovery-key` on `encrypt` and `convert`.
#[derive(Args, Default)]
pub struct RecoveryOffer {
    /// Create a recovery key and show it before anything is encrypted
    #[arg(long, conflicts_with = "no_recovery_key")]
    pub recovery_key: bool,
    /// Do not create a recovery key (and do not ask)
    #[arg(long)]
    pub no_recovery_key: bool,
}

#[derive(Subcommand)]
pub enum HomeCmd {
    /// Create USER's home (from the passwd entry) encrypted from the start, then copy the skeleton
    /// into it; the home must not exist or be empty (for one that holds data, use `convert`)
    Create(CreateArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// The account (it must exist: `useradd -M USER` first)
    pub user: String,
    /// The skeleton copied into the new home
    #[arg(long, value_name = "DIR", default_value = skel_dir())]
    pub skel: PathBuf,
    /// Kind of the user's new protector (named after them, theirs)
    #[arg(long, alias = "type", default_value = default_kind(), value_parser = PossibleValuesParser::new(kind_names().iter().copied()))]
    pub protector_type: String,
    #[command(flatten)]
    pub kdf: KdfArgs,
    #[command(flatten)]
    pub recovery: RecoveryOffer,
    /// Print the result as one JSON object
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum Tpm2Cmd {
    /// Is there a TPM, and how many wrong PINs may still be tried before it locks out?
    Status {
        /// Print JSON (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
    /// Own the TPM's lockout: set the dictionary-attack parameters and give the lockout hierarchy
    /// a random password, shown once as the TPM reset code (write it down). Once owned, giving
    /// parameters changes them (the reset code is asked).
    Setup {
        /// Wrong PINs (across all TPM protectors) before the TPM locks out [default: 6]
        #[arg(long, value_name = "N")]
        max_tries: Option<u32>,
        /// Seconds after which the TPM forgives one wrong PIN (0: never, only a reset) [default: 7200]
        #[arg(long, value_name = "S")]
        recovery_time: Option<u32>,
        /// Seconds the lockout hierarchy stays blocked after a wrong reset code [default: 600]
        #[arg(long, value_name = "S")]
        lockout_recovery: Option<u32>,
        /// Print the reset code without asking for it back (scripts)
        #[arg(long)]
        yes: bool,
    },
    /// Forget every counted wrong PIN now; asks for the TPM reset code (on a terminal, else one
    /// line on stdin)
    ResetLockout,
}

#[derive(Subcommand)]
pub enum Fido2Cmd {
    /// Connected security keys: path, product, and whether each can hold a FIDO2 protector
    List {
        /// Print JSON (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum AutologinCmd {
    /// Before the display manager starts: unlock the autologin user's encrypted home with a protector that needs no typing, else turn autologin off for this boot
    Check {
        /// The root of the system whose display managers are configured (for images and tests)
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Print the outcome as JSON
        #[arg(long)]
        json: bool,
    },
    /// Which display manager logs in whom, and what the next boot does with an encrypted home
    Status {
        /// The root of the system whose display managers are configured (for images and tests)
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Print JSON (stable field names, docs/formats.md)
        #[arg(long)]
        json: bool,
    },
    /// Turn every automatic login off for this boot, whatever the home (dirseal-autologin.service runs it when the check failed); needs no keystore
    Off {
        /// The root of the system whose display managers are configured (for images and tests)
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
    },
    /// Remove every drop-in and runtime copy dirseal wrote for autologins (uninstalling does it)
    Clear {
        /// The root of the system whose display managers are configured (for images and tests)
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
    },
}

#[derive(Args)]
pub struct ScrubArgs {
    /// The filesystem's mount point (any path on it names the same filesystem)
    pub mountpoint: PathBuf,
    /// Free space to leave for other programs meanwhile, e.g. 64M or 2G [default: 1% of the filesystem, 16M to 1G]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub reserve: Option<u64>,
    /// Do not TRIM the free space afterwards
    #[arg(long)]
    pub no_trim: bool,
    /// One JSON progress object per second on stdout, and a JSON result
    #[arg(long)]
    pub json: bool,
}

/// `123`, `64K`, `64M`, `2G`, `1T` (binary units; an optional trailing `B` or `iB`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown unit in {s:?}; use K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size; write e.g. 64M or 2G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}
