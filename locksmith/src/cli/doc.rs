//! Renders what `usage.rs` and the backends' key tables say (issue 16): `--help`,
//! `locksmith help SUBCOMMAND`, `--version`, the man pages locksmith(1) and
//! locksmith-profiles(5), and the bash, zsh and fish completion scripts
//! (`locksmith --generate KIND`). Nothing here is written twice: a new option, subcommand or
//! profile key appears in all of them.

use super::usage::{
    ENVIRONMENT, LOCK_TEXT, OPTIONS, OptDoc, PROTOCOL_TEXT, SUBCOMMANDS, Scope, SubDoc, TAIL_TEXT,
    Value,
};
use crate::backend::BACKENDS;
use crate::error::Kind;
use crate::profile::PROFILE_KEYS;
use crate::settings::{COMMON_KEYS, KeyDoc};

const NAME_LINE: &str =
    "locksmith - take a lock for your parent process and hold it exactly as long as it wants it";

/// Where help's second column starts.
const COLUMN: usize = 47;
/// Where an option's help starts.
const OPT_COLUMN: usize = 24;

fn push_column(out: &mut String, left: &str, column: usize, text: &str) {
    out.push_str(left);
    let mut lines = text.lines();
    if let Some(first) = lines.next() {
        if left.len() + 2 > column {
            out.push('\n');
            out.push_str(&" ".repeat(column));
        } else {
            out.push_str(&" ".repeat(column - left.len()));
        }
        out.push_str(first);
    }
    out.push('\n');
    for l in lines {
        out.push_str(&" ".repeat(column));
        out.push_str(l);
        out.push('\n');
    }
}

fn option_line(out: &mut String, o: &OptDoc) {
    let indent = if o.shorts.is_empty() { "      " } else { "  " };
    push_column(out, &format!("{indent}{}", o.spelled()), OPT_COLUMN, o.help);
}

fn usage_lines(out: &mut String, sub: &SubDoc) {
    for (form, about) in sub.forms {
        let text = if about.is_empty() { "" } else { about };
        push_column(out, &format!("  locksmith [OPTIONS] {form}"), COLUMN, text);
    }
}

/// `locksmith --help`.
pub fn help() -> String {
    let mut s = format!("{NAME_LINE}\n\nUsage:\n");
    for sub in SUBCOMMANDS {
        usage_lines(&mut s, sub);
    }
    s.push('\n');
    s.push_str(LOCK_TEXT);
    s.push('\n');
    s.push_str(PROTOCOL_TEXT);
    s.push_str("\nOptions:\n");
    for o in OPTIONS.iter().filter(|o| o.scope == Scope::Global) {
        option_line(&mut s, o);
    }
    s.push_str("\nSubcommand options:\n");
    for o in OPTIONS.iter().filter(|o| o.scope != Scope::Global) {
        option_line(&mut s, o);
    }
    s.push('\n');
    s.push_str(TAIL_TEXT);
    s
}

/// `locksmith help SUB` (and `locksmith SUB --help`).
pub fn help_for(sub: &SubDoc) -> String {
    let mut s = format!("locksmith {} - {}\n\nUsage:\n", sub.name, sub.about);
    usage_lines(&mut s, sub);
    s.push('\n');
    s.push_str(sub.text);
    s.push('\n');
    let own: Vec<&OptDoc> = OPTIONS
        .iter()
        .filter(|o| o.scope != Scope::Global && o.belongs_to(sub.name))
        .collect();
    if !own.is_empty() {
        s.push_str("\nOptions:\n");
        for o in own {
            option_line(&mut s, o);
        }
    }
    if sub.name != "help" {
        s.push_str("\nGlobal options:\n");
        for o in OPTIONS.iter().filter(|o| o.scope == Scope::Global) {
            option_line(&mut s, o);
        }
    }
    if !matches!(sub.name, "help" | "profiles") {
        s.push('\n');
        s.push_str(LOCK_TEXT);
    }
    s
}

/// `locksmith --version`: the version and the backends this build has.
pub fn version() -> String {
    let built: Vec<&str> = BACKENDS
        .iter()
        .filter(|e| e.built())
        .map(|e| e.name)
        .collect();
    let left: Vec<&str> = BACKENDS
        .iter()
        .filter(|e| !e.built())
        .map(|e| e.name)
        .collect();
    // A build of the local backends with its companion beside it has them all (the
    // Debian package's): it says which ones the companion takes.
    let companion = if left.is_empty() {
        None
    } else {
        crate::companion::path().ok()
    };
    let every: Vec<&str> = BACKENDS.iter().map(|e| e.name).collect();
    let mut s = format!(
        "locksmith {}\nbackends: {}\n",
        env!("CARGO_PKG_VERSION"),
        if companion.is_some() { &every } else { &built }.join(", ")
    );
    if let Some(path) = companion {
        s.push_str(&format!(
            "handed to {}: {}\n",
            path.display(),
            left.join(", ")
        ));
    } else if !left.is_empty() {
        s.push_str(&format!(
            "left out of this build: {} (cargo features)\n",
            left.join(", ")
        ));
    }
    s
}

/// Text for roff: backslashes escaped, no line starting with a control character.
fn roff(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.replace('\\', "\\e");
        if line.starts_with(['.', '\'']) {
            out.push_str("\\&");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A paragraph as roff fills it (help's line breaks are the terminal's, not the text's).
fn filled(text: &str) -> String {
    roff(&text.lines().map(str::trim).collect::<Vec<_>>().join(" "))
}

/// An option's spellings in bold, its value in italics.
fn roff_option(o: &OptDoc) -> String {
    let mut names: Vec<String> = o.shorts.iter().map(|c| format!("\\fB\\-{c}\\fR")).collect();
    names.extend(o.longs.iter().map(|l| format!("\\fB\\-\\-{l}\\fR")));
    let mut s = names.join(", ");
    if let Some(v) = o.value.name() {
        s.push_str(&format!(" \\fI{v}\\fR"));
    }
    s
}

fn header(name: &str, section: u8, what: &str) -> String {
    format!(
        ".\\\" Generated by `locksmith --generate`; edit locksmith/src/cli/usage.rs instead.\n\
         .TH {name} {section} \"\" \"locksmith {}\" \"{what}\"\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `locksmith --generate man`: locksmith(1).
pub fn man() -> String {
    let mut s = header("LOCKSMITH", 1, "User Commands");
    s.push_str(".SH NAME\nlocksmith \\- take a lock for your parent process and hold it exactly as long as it wants it\n");
    s.push_str(".SH SYNOPSIS\n");
    for sub in SUBCOMMANDS {
        for (form, _) in sub.forms {
            s.push_str(&format!(
                ".B locksmith\n[OPTIONS] {}\n.br\n",
                roff(form).trim_end()
            ));
        }
    }
    s.push_str(".SH DESCRIPTION\n");
    s.push_str(&filled(
        "locksmith takes a lock on behalf of its parent process and holds it exactly as long as \
         the parent wants it: until the parent closes the pipe it reads locksmith's output from, \
         or dies. If locksmith itself dies, the lock becomes breakable: at once on proof of \
         death on the same host (the kernel releases a flock lock by itself), otherwise after \
         the profile's stale_after of silence, never before.",
    ));
    s.push_str(".PP\n");
    s.push_str(&filled(
        "Invoked under the name flock (a symlink or copy named flock), locksmith is \
         util-linux's flock(1): its forms (FILE|DIRECTORY COMMAND, -c, a descriptor NUMBER), \
         options, exit codes and silence, and in place of FILE also a lock address \
         (flock mkdir:/nfs/locks/x backup.sh). See flock(1).",
    ));
    s.push_str(".PP\n");
    s.push_str(&filled(PROTOCOL_TEXT));
    s.push_str(".SH LOCK\n.nf\n");
    s.push_str(&roff(LOCK_TEXT));
    s.push_str(".fi\n.SH COMMANDS\n");
    for sub in SUBCOMMANDS {
        s.push_str(&format!(
            ".TP\n.B {}\n",
            roff(sub.forms[0].0).trim_end().replace('-', "\\-")
        ));
        s.push_str(&filled(sub.text));
    }
    s.push_str(".SH OPTIONS\n");
    for o in OPTIONS {
        s.push_str(&format!(".TP\n{}\n", roff_option(o)));
        s.push_str(&filled(o.help));
    }
    s.push_str(".SH EXIT STATUS\n");
    s.push_str(&filled(
        "Hold mode exits 0 after releasing; run (and flock(1)'s forms LOCK CMD, LOCK -c) \
         exits with CMD's status: 128+N if signal N killed it, 127 if CMD was not found, 126 \
         if it could not be executed (under the name flock: 69, as flock(1)). A busy lock is \
         75, or the -E code (under the name flock: 1, or -E). Otherwise the sysexits code of \
         the error, whose kind is the word after ERROR:",
    ));
    for kind in Kind::ALL {
        s.push_str(&format!(
            ".TP\n.B {}\n{} \\(em {}\n",
            kind.exit_code(),
            kind.as_str(),
            kind.about()
        ));
    }
    s.push_str(".SH ENVIRONMENT\n");
    for (var, what) in ENVIRONMENT {
        s.push_str(&format!(".TP\n.B {var}\n"));
        s.push_str(&filled(what));
    }
    s.push_str(".SH FILES\n.TP\n.I $XDG_CONFIG_HOME/locksmith/profiles.toml\n");
    s.push_str("The user's profiles file (~/.config/locksmith/profiles.toml).\n");
    s.push_str(".TP\n.I /etc/locksmith/profiles.toml\nThe system's profiles file; see \\fBlocksmith-profiles\\fR(5).\n");
    s.push_str(".SH EXAMPLES\n.nf\n");
    s.push_str(&roff(
        "locksmith run /tmp/demo.lock -- echo held        # flock(2), as flock(1) would\n\
         locksmith -n /var/lock/backup.lock backup.sh      # flock(1)'s form: give up at once\n\
         locksmith run nightly -- /usr/local/bin/backup.sh # a profile of the profiles file\n\
         open L, \"locksmith phonestuff |\"; <L>;           # Perl: held until close L\n\
         locksmith status --json phonestuff\n",
    ));
    s.push_str(".fi\n.SH SEE ALSO\n.BR flock (1),\n.BR locksmith-profiles (5)\n");
    s
}

fn roff_keys(s: &mut String, keys: &[KeyDoc]) {
    for k in keys {
        s.push_str(&format!(
            ".TP\n\\fB{}\\fR = {}\n",
            k.key,
            roff(k.example).trim_end()
        ));
        s.push_str(&filled(k.doc));
    }
}

/// `locksmith --generate man-profiles`: locksmith-profiles(5).
pub fn man_profiles() -> String {
    let mut s = header("LOCKSMITH-PROFILES", 5, "File Formats");
    s.push_str(".SH NAME\nlocksmith-profiles \\- the profiles file of locksmith(1)\n");
    s.push_str(".SH SYNOPSIS\n.nf\n--profiles FILE\n$LOCKSMITH_PROFILES\n$XDG_CONFIG_HOME/locksmith/profiles.toml\n/etc/locksmith/profiles.toml\n.fi\n");
    s.push_str(".SH DESCRIPTION\n");
    s.push_str(&filled(
        "A TOML file of named locks. Each [profile.NAME] section is one lock: its backend and \
         where the lock is, its timings and its credentials; `locksmith NAME` takes it. An \
         optional [defaults] section gives timings for every profile. Precedence: the command \
         line, then the profile, then [defaults], then the built-in values. The first file \
         found in the order of the synopsis is used; a file named by --profiles or \
         $LOCKSMITH_PROFILES that does not exist is an error. Relative paths are resolved \
         against the file's own directory. A key the profile's backend does not take is an \
         error (exit 78), never ignored. A profile may not be named like a subcommand.",
    ));
    s.push_str(".PP\n");
    s.push_str(&filled(
        "A file that holds an inline password (or any password_file) must be owned by the user \
         or root and not readable by group or others (exit 78 otherwise, as ssh does for keys). \
         A lock address (see locksmith(1)) takes the same keys as its query parameters.",
    ));
    s.push_str(".SH KEYS OF EVERY PROFILE\n");
    roff_keys(&mut s, PROFILE_KEYS);
    roff_keys(&mut s, COMMON_KEYS);
    s.push_str(".SH BACKENDS\n");
    for e in BACKENDS {
        s.push_str(&format!(".SS {}\n", e.name));
        s.push_str(&filled(e.about));
        if !e.built() {
            s.push_str(".PP\nLeft out of this build of locksmith (its cargo feature).\n");
        }
        for keys in e.keys {
            roff_keys(&mut s, keys);
        }
    }
    s.push_str(".SH EXAMPLE\n.nf\n");
    s.push_str(&roff(
        "[defaults]\n\
         wait = \"10m\"\n\
         stale_after = \"60s\"\n\
         \n\
         [profile.counter]\n\
         backend = \"flock\"\n\
         path = \"/var/lock/myapp/counter.sem\"\n\
         \n\
         [profile.phonestuff]\n\
         backend = \"ftp\"\n\
         host = \"ftp.example.com\"\n\
         user = \"phoneacc\"\n\
         password_env = \"PHONE_FTP_PASSWORD\"\n\
         tls = \"explicit\"\n\
         path = \"phone_lock\"\n\
         \n\
         [profile.nightly]\n\
         url = \"postgres://locker@db.example.com/app?lock=nightly\"\n",
    ));
    s.push_str(".fi\n.SH SEE ALSO\n.BR locksmith (1)\n");
    s
}

/// Every spelling of the options that take a value.
fn valued() -> Vec<String> {
    let mut v = Vec::new();
    for o in OPTIONS.iter().filter(|o| o.value != Value::None) {
        v.extend(o.shorts.iter().map(|c| format!("-{c}")));
        v.extend(o.longs.iter().map(|l| format!("--{l}")));
    }
    v
}

fn spellings(o: &OptDoc) -> Vec<String> {
    let mut v: Vec<String> = o.shorts.iter().map(|c| format!("-{c}")).collect();
    v.extend(o.longs.iter().map(|l| format!("--{l}")));
    v
}

fn sub_names() -> String {
    SUBCOMMANDS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Options offered after subcommand `sub` (`""`: hold mode or flock(1)'s forms, which are
/// `run`).
fn offered(sub: &str) -> Vec<String> {
    let sub = if sub.is_empty() { "run" } else { sub };
    OPTIONS
        .iter()
        .filter(|o| o.scope == Scope::Global || o.belongs_to(sub))
        .flat_map(spellings)
        .collect()
}

/// The completion scripts' `case "$prev"` arms: after an option that takes a value, complete
/// that value as `action` says for its kind (`None`: the option takes none).
fn value_arms(action: impl Fn(&Value) -> Option<String>) -> String {
    let mut arms = String::new();
    for o in OPTIONS {
        if let Some(action) = action(&o.value) {
            arms.push_str(&format!(
                "        {}) {action}; return ;;\n",
                spellings(o).join("|")
            ));
        }
    }
    arms
}

/// The completion scripts' reading of the words before the cursor (bash and zsh alike): sets
/// `sub` (the subcommand), `lock` (the first other word) and `after` (a word past LOCK: the
/// command has begun), skipping the values of options that take one. `words` is the shell's
/// array of words, `first` the index of the first word after `locksmith`, `cursor` the index
/// of the word being completed.
fn scan_words(words: &str, first: usize, cursor: &str) -> String {
    format!(
        r#"    local i w sub= lock= after=
    for ((i = {first}; i < {cursor}; i++)); do
        w="${{{words}[i]}}"
        if [[ -n $lock ]]; then after=1; break; fi
        case "$w" in
            {valued}) ((i++)) ;;
            -*) ;;
            *)
                if [[ -z $sub && " {subs} " == *" $w "* ]]; then
                    sub=$w
                else
                    lock=$w
                    # An address bash split at its colon (COMP_WORDBREAKS): one word, and
                    # not yet whole while the cursor is in it.
                    if [[ ${{{words}[i+1]}} == : ]]; then
                        ((i += 2))
                        ((i >= {cursor})) && lock=
                    fi
                fi ;;
        esac
    done
"#,
        valued = valued().join("|"),
        subs = sub_names(),
    )
}

/// `locksmith --generate complete-bash`.
pub fn bash() -> String {
    let mut by_sub = String::new();
    for sub in [""].iter().chain(SUBCOMMANDS.iter().map(|s| &s.name)) {
        by_sub.push_str(&format!(
            "        {}) opts=\"{}\" ;;\n",
            if sub.is_empty() { "''" } else { sub },
            offered(sub).join(" ")
        ));
    }
    let prev = value_arms(|value| match value {
        Value::None => None,
        Value::File(_) => Some("COMPREPLY=($(compgen -f -- \"$cur\"))".to_string()),
        Value::Dir(_) => Some("COMPREPLY=($(compgen -d -- \"$cur\"))".to_string()),
        Value::Text(_) => Some("COMPREPLY=()".to_string()),
        Value::Word(_, words) => Some(format!(
            "COMPREPLY=($(compgen -W \"{}\" -- \"$cur\"))",
            words.join(" ")
        )),
    });
    format!(
        r#"# bash completion for locksmith. Generated by `locksmith --generate complete-bash`.
# Profile names come from `locksmith profiles` (of --profiles FILE when the line gives one).

_locksmith_profiles() {{
    local i args=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --profiles) args=(--profiles "${{COMP_WORDS[i+1]}}") ;;
            --profiles=*) args=("${{COMP_WORDS[i]}}") ;;
        esac
    done
    "${{COMP_WORDS[0]}}" "${{args[@]}}" profiles 2>/dev/null | cut -f1
}}

_locksmith() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    case "$prev" in
{prev}    esac
    # The PATH of a file backend's address, which bash split at its colon: files.
    if [[ " {file_schemes} " == *" ${{COMP_WORDS[COMP_CWORD-2]}} "* && $prev == : ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    if [[ " {file_schemes} " == *" $prev "* && $cur == : ]]; then
        # bash keeps the colon it split at: the files alone follow it.
        COMPREPLY=($(compgen -f -- ""))
        return
    fi
{scan}    if [[ -n $lock ]]; then
        # After LOCK: the command to run (run, flock(1)'s forms), then its arguments.
        if [[ -z $after || $prev == -- ]]; then
            COMPREPLY=($(compgen -c -- "$cur"))
        else
            COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return
    fi
    local opts
    case "$sub" in
{by_sub}    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi
    case "$sub" in
        help) COMPREPLY=($(compgen -W "{subs}" -- "$cur")); return ;;
        profiles) COMPREPLY=(); return ;;
        '') COMPREPLY=($(compgen -W "{subs} $(_locksmith_profiles)" -- "$cur")) ;;
        *) COMPREPLY=($(compgen -W "$(_locksmith_profiles)" -- "$cur")) ;;
    esac
    # A path is a lock address too (flock on that file).
    if [[ $cur == */* || $cur == .* || $cur == '~'* ]]; then
        COMPREPLY+=($(compgen -f -- "$cur"))
    fi
    # So is SCHEME:PATH or SCHEME://…: the schemes, followed by the rest, not a space.
    if [[ -n $cur && $cur != *[:/]* ]]; then
        local schemes=($(compgen -W "{schemes}" -- "$cur"))
        if ((${{#schemes[@]}})); then
            COMPREPLY+=("${{schemes[@]}}")
            compopt -o nospace 2>/dev/null || true
        fi
    fi
}}

complete -F _locksmith locksmith
"#,
        scan = scan_words("COMP_WORDS", 1, "COMP_CWORD"),
        subs = sub_names(),
        schemes = crate::backend::scheme_prefixes().join(" "),
        file_schemes = file_schemes().join(" "),
    )
}

/// The address schemes of the file backends (`mkdir`, …): `SCHEME:PATH`.
fn file_schemes() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .filter(|e| e.on_files)
        .flat_map(|e| e.schemes.iter().copied())
        .collect()
}

/// A description for a completion menu: the first line, without quotes that would end it.
fn menu(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .replace('\'', "")
        .replace(['[', ']'], "")
        .replace(':', " -")
        .trim_end_matches([';', ',', ' '])
        .to_string()
}

/// `locksmith --generate complete-zsh` (a `_locksmith` function file for `fpath`).
pub fn zsh() -> String {
    let subs: Vec<String> = SUBCOMMANDS
        .iter()
        .map(|s| format!("'{}:{}'", s.name, menu(s.about)))
        .collect();
    let prev = value_arms(|value| match value {
        Value::None => None,
        Value::File(_) => Some("_files".to_string()),
        Value::Dir(_) => Some("_files -/".to_string()),
        Value::Text(_) => Some("_message 'a value'".to_string()),
        Value::Word(_, words) => Some(format!("compadd -- {}", words.join(" "))),
    });
    let mut by_sub = String::new();
    for sub in [""].iter().chain(SUBCOMMANDS.iter().map(|s| &s.name)) {
        let sub_opts: Vec<String> = OPTIONS
            .iter()
            .filter(|o| {
                o.scope == Scope::Global || o.belongs_to(if sub.is_empty() { "run" } else { sub })
            })
            .flat_map(|o| {
                spellings(o)
                    .into_iter()
                    .map(move |sp| format!("'{}:{}'", sp, menu(o.help)))
            })
            .collect();
        by_sub.push_str(&format!(
            "        {}) opts=({}) ;;\n",
            if sub.is_empty() { "''" } else { sub },
            sub_opts.join(" ")
        ));
    }
    format!(
        r#"#compdef locksmith
# zsh completion for locksmith. Generated by `locksmith --generate complete-zsh`; install it as
# `_locksmith` in a directory of $fpath. Profile names come from `locksmith profiles`.

_locksmith_profiles() {{
    local i
    local -a args names
    for (( i = 2; i < CURRENT; i++ )); do
        case ${{words[i]}} in
            --profiles) args=(--profiles ${{words[i+1]}}) ;;
            --profiles=*) args=(${{words[i]}}) ;;
        esac
    done
    names=(${{(f)"$(${{words[1]}} $args profiles 2>/dev/null | cut -f1)"}})
    (( ${{#names}} )) && compadd -X profile -- $names
}}

_locksmith() {{
    local -a subs opts
    subs=({subs})
    case ${{words[CURRENT-1]}} in
{prev}    esac
{scan}    if [[ -n $lock ]]; then
        if [[ -z $after || ${{words[CURRENT-1]}} == -- ]]; then
            _command_names -e
        else
            _files
        fi
        return
    fi
    case $sub in
{by_sub}    esac
    if [[ ${{words[CURRENT]}} == -* ]]; then
        _describe -t options option opts
        return
    fi
    case $sub in
        help) _describe -t commands subcommand subs ;;
        profiles) ;;
        '')
            _describe -t commands subcommand subs
            _locksmith_lock
            ;;
        *)
            _locksmith_lock
            ;;
    esac
}}

# LOCK: a profile name, a path, SCHEME:PATH (files after the colon) or SCHEME://….
_locksmith_lock() {{
    local cur=${{words[CURRENT]}}
    if [[ $cur == ({file_alts}):* ]]; then
        compset -P '*:'
        _files
        return
    fi
    _locksmith_profiles
    [[ $cur == */* || $cur == .* ]] && _files
    [[ -n $cur && $cur != *[:/]* ]] && compadd -S '' -- {schemes}
}}

if [[ $funcstack[1] == _locksmith ]]; then
    _locksmith "$@"
else
    compdef _locksmith locksmith
fi
"#,
        subs = subs.join(" "),
        scan = scan_words("words", 2, "CURRENT"),
        file_alts = file_schemes().join("|"),
        schemes = crate::backend::scheme_prefixes().join(" "),
    )
}

/// `locksmith --generate complete-fish`.
pub fn fish() -> String {
    let mut s = format!(
        r#"# fish completion for locksmith. Generated by `locksmith --generate complete-fish`.
# Profile names come from `locksmith profiles` (of --profiles FILE when the line gives one).

# Prints the subcommand so far (or -) and whether LOCK was given (0/1).
function __locksmith_state
    set -l words (commandline -opc)
    set -e words[1]
    set -l sub -
    set -l lock 0
    set -l skip 0
    for w in $words
        if test $skip = 1
            set skip 0
            continue
        end
        if test $lock = 1
            break
        end
        switch $w
            case {valued}
                set skip 1
            case '-*'
            case '*'
                if test $sub = -; and contains -- $w {names}
                    set sub $w
                else
                    set lock 1
                end
        end
    end
    echo $sub
    echo $lock
end

function __locksmith_first
    set -l s (__locksmith_state)
    test $s[1] = -; and test $s[2] = 0
end

function __locksmith_wants_lock
    set -l s (__locksmith_state)
    test $s[2] = 0; and not contains -- $s[1] profiles help
end

function __locksmith_in
    set -l s (__locksmith_state)
    test $s[2] = 0; and contains -- $s[1] $argv
end

function __locksmith_profiles
    set -l words (commandline -opc)
    set -l args
    for i in (seq 2 (count $words))
        switch $words[$i]
            case --profiles
                set args --profiles $words[(math $i + 1)]
            case '--profiles=*'
                set args $words[$i]
        end
    end
    $words[1] $args profiles 2>/dev/null | string replace -r '\t.*' ''
end

# SCHEME:PATH (the files after the colon) and the schemes themselves.
function __locksmith_addresses
    set -l t (commandline -ct)
    if string match -qr '^({file_alts}):' -- $t
        set -l scheme (string replace -r ':.*' ':' -- $t)
        for p in (__fish_complete_path (string replace -r '^[^:]*:' '' -- $t))
            echo $scheme$p
        end
    else if string match -qr -- '^[./~]' $t
        # A path is a lock address too (flock on that file).
        __fish_complete_path $t
    else if test -n "$t"; and not string match -qr -- '[:/]' $t
        printf '%s\n' {schemes}
    end
end

complete -c locksmith -f
complete -c locksmith -n __locksmith_wants_lock -a '(__locksmith_profiles)' -d profile
complete -c locksmith -n __locksmith_wants_lock -a '(__locksmith_addresses)'
complete -c locksmith -n '__locksmith_in help' -a '{names}'
"#,
        valued = valued().join(" "),
        names = sub_names(),
        file_alts = file_schemes().join("|"),
        schemes = crate::backend::scheme_prefixes().join(" "),
    );
    for sub in SUBCOMMANDS {
        s.push_str(&format!(
            "complete -c locksmith -n __locksmith_first -a {} -d '{}'\n",
            sub.name,
            menu(sub.about)
        ));
    }
    for o in OPTIONS {
        let mut line = String::from("complete -c locksmith");
        if let Scope::Only(subs) = o.scope {
            // flock(1)'s forms are `run` without the word.
            let mut subs: Vec<&str> = subs.to_vec();
            if subs.contains(&"run") {
                subs.push("-");
            }
            line.push_str(&format!(" -n '__locksmith_in {}'", subs.join(" ")));
        }
        for c in o.shorts {
            line.push_str(&format!(" -s {c}"));
        }
        for l in o.longs {
            line.push_str(&format!(" -l {l}"));
        }
        match o.value {
            Value::None => {}
            Value::File(_) => line.push_str(" -r -F"),
            Value::Dir(_) => line.push_str(" -x -a '(__fish_complete_directories)'"),
            Value::Text(_) => line.push_str(" -x"),
            Value::Word(_, words) => line.push_str(&format!(" -x -a '{}'", words.join(" "))),
        }
        line.push_str(&format!(" -d '{}'\n", menu(o.help)));
        s.push_str(&line);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option and subcommand reaches help and the man page.
    #[test]
    fn help_and_man_name_everything() {
        let (h, m) = (help(), man());
        for o in OPTIONS {
            assert!(h.contains(&o.spelled()), "help misses {}", o.spelled());
            for l in o.longs {
                assert!(m.contains(&format!("\\-\\-{l}")), "man misses --{l}");
            }
        }
        for sub in SUBCOMMANDS {
            for (form, _) in sub.forms {
                assert!(h.contains(form), "help misses {form}");
            }
            assert!(help_for(sub).contains(sub.text.lines().next().unwrap()));
        }
        for line in h.lines() {
            assert!(line.len() <= 100, "help line too long: {line}");
        }
    }

    /// Every documented key reaches the profiles man page, under its backend.
    #[test]
    fn profiles_man_names_every_key() {
        let m = man_profiles();
        for e in BACKENDS {
            let at = m.find(&format!(".SS {}\n", e.name)).expect(e.name);
            for k in e.keys.iter().flat_map(|k| k.iter()) {
                assert!(m[at..].contains(&format!("\\fB{}\\fR", k.key)), "{}", k.key);
            }
        }
        for k in COMMON_KEYS.iter().chain(PROFILE_KEYS) {
            assert!(m.contains(&format!("\\fB{}\\fR", k.key)), "{}", k.key);
        }
    }
}
