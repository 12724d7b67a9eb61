//! `leasehold completions bash|zsh|fish`: shell completion scripts, read off the clap
//! command tree (subcommands, their options, and the values an option or argument
//! accepts), so they cannot fall out of step with the CLI.
//!
//! Load one with `source <(leasehold completions bash)` (bash or zsh) or
//! `leasehold completions fish | source`.

use std::fmt::Write;

use clap::CommandFactory;

/// Options of `leasehold completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells completions are written for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    /// Bash (the `complete` builtin).
    Bash,
    /// Zsh, through its bash-completion emulation (`bashcompinit`).
    Zsh,
    /// Fish (`complete -c` lines).
    Fish,
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> String {
    let mut cli = super::Cli::command();
    cli.build();
    let top = Level::of(&cli);
    let subs: Vec<Level> = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(Level::of)
        .collect();
    match shell {
        Shell::Bash => bash(&top, &subs),
        Shell::Zsh => zsh(&top, &subs),
        Shell::Fish => fish(&top, &subs),
    }
}

/// One command's completable words.
struct Level {
    name: String,
    about: String,
    options: Vec<Opt>,
    /// The values its positional arguments accept (e.g. the shell names).
    values: Vec<String>,
}

/// One option.
struct Opt {
    long: Option<String>,
    short: Option<char>,
    takes_value: bool,
    values: Vec<String>,
    help: String,
}

impl Opt {
    /// How the option is spelt: `--long` and `-s`.
    fn spellings(&self) -> impl Iterator<Item = String> {
        let long = self.long.iter().map(|l| format!("--{l}"));
        long.chain(self.short.iter().map(|s| format!("-{s}")))
    }
}

impl Level {
    fn of(cmd: &clap::Command) -> Self {
        let visible = |a: &&clap::Arg| !a.is_hide_set();
        let values_of = |a: &clap::Arg| -> Vec<String> {
            a.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect()
        };
        let options = cmd
            .get_arguments()
            .filter(visible)
            .filter(|a| !a.is_positional())
            .map(|a| Opt {
                long: a.get_long().map(String::from),
                short: a.get_short(),
                takes_value: a.get_action().takes_values(),
                values: values_of(a),
                help: first_line(a.get_help()),
            })
            .collect();
        let values = cmd.get_positionals().filter(visible).flat_map(values_of).collect();
        let mut names: Vec<String> = Vec::new();
        if cmd.has_subcommands() {
            names = cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect();
        }
        Level {
            name: cmd.get_name().to_string(),
            about: first_line(cmd.get_about()),
            options,
            values: if names.is_empty() { values } else { names },
        }
    }

    fn flags(&self) -> String {
        self.options
            .iter()
            .flat_map(Opt::spellings)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The first sentence of a help text, for a one-line description.
fn first_line(text: Option<&clap::builder::StyledStr>) -> String {
    let text = text.map(|t| t.to_string()).unwrap_or_default();
    let line = text.lines().next().unwrap_or("");
    let sentence = line.split_once(". ").map_or(line, |(first, _)| first);
    sentence.trim_end_matches('.').to_string()
}

fn bash(top: &Level, subs: &[Level]) -> String {
    let mut levels = format!(
        "        \"\") opts='{}'; values='{}' ;;\n",
        top.flags(),
        top.values.join(" ")
    );
    let mut option_values = String::new();
    for sub in subs {
        let _ = writeln!(
            levels,
            "        {}) opts='{}'; values='{}' ;;",
            sub.name,
            sub.flags(),
            sub.values.join(" ")
        );
        for opt in sub.options.iter().filter(|o| o.takes_value) {
            let pattern: Vec<String> = opt.spellings().map(|s| format!("\"{} {s}\"", sub.name)).collect();
            let action = if opt.values.is_empty() {
                "return 0".to_string() // a free value: the default (file names)
            } else {
                format!(
                    "COMPREPLY=($(compgen -W '{}' -- \"$cur\")); return 0",
                    opt.values.join(" ")
                )
            };
            let _ = writeln!(option_values, "        {}) {action} ;;", pattern.join("|"));
        }
    }
    format!(
        r#"# bash completion for leasehold; generated by `leasehold completions bash`.
# Load it with: source <(leasehold completions bash)
_leasehold() {{
    local cur="$2" prev="$3" sub="" word n=0 opts="" values=""
    for word in "${{COMP_WORDS[@]}}"; do
        (( n >= COMP_CWORD )) && break
        if (( n > 0 )); then
            [[ $word == -- ]] && return 0 # the wrapped command's words: default completion
            [[ -z $sub && $word != -* ]] && sub=$word
        fi
        n=$((n + 1))
    done
    case "$sub" in
{levels}        *) return 0 ;;
    esac
    case "$sub $prev" in
{option_values}    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ -n $values ]]; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
    fi
    return 0
}}
complete -o default -F _leasehold leasehold
"#
    )
}

fn zsh(top: &Level, subs: &[Level]) -> String {
    format!(
        "# zsh completion for leasehold; generated by `leasehold completions zsh`.\n\
         # Load it with: source <(leasehold completions zsh)\n\
         (( $+functions[compdef] )) || {{ autoload -U +X compinit && compinit }}\n\
         autoload -U +X bashcompinit && bashcompinit\n{}",
        bash(top, subs)
    )
}

fn fish(top: &Level, subs: &[Level]) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut out = String::from(
        "# fish completion for leasehold; generated by `leasehold completions fish`.\n\
         # Load it with: leasehold completions fish | source\n",
    );
    let mut option_lines = |condition: &str, level: &Level| {
        for opt in &level.options {
            let mut line = format!("complete -c leasehold -n {}", quote(condition));
            if let Some(s) = opt.short {
                let _ = write!(line, " -s {s}");
            }
            if let Some(l) = &opt.long {
                let _ = write!(line, " -l {l}");
            }
            if !opt.values.is_empty() {
                let _ = write!(line, " -x -a {}", quote(&opt.values.join(" ")));
            } else if opt.takes_value {
                line.push_str(" -r");
            }
            let _ = writeln!(line, " -d {}", quote(&opt.help));
            out.push_str(&line);
        }
    };
    option_lines("__fish_use_subcommand", top);
    for sub in subs {
        option_lines(&format!("__fish_seen_subcommand_from {}", sub.name), sub);
    }
    for sub in subs {
        let _ = writeln!(
            out,
            "complete -c leasehold -n __fish_use_subcommand -f -a {} -d {}",
            sub.name,
            quote(&sub.about)
        );
        if !sub.values.is_empty() {
            let _ = writeln!(
                out,
                "complete -c leasehold -n '__fish_seen_subcommand_from {}' -f -a {}",
                sub.name,
                quote(&sub.values.join(" "))
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VISIBLE: [&str; 6] = ["crd", "controller", "run", "status", "dev", "completions"];

    #[test]
    fn bash_completes_every_visible_subcommand_and_its_long_options() {
        let text = script(Shell::Bash);
        for sub in VISIBLE {
            assert!(
                text.contains(&format!("        {sub}) opts='")),
                "{sub} missing:\n{text}"
            );
        }
        assert!(
            !text.contains("check-log") && !text.contains("guard)"),
            "hidden commands are not offered"
        );
        let run = text.lines().find(|l| l.trim_start().starts_with("run)")).unwrap();
        for flag in [
            "--lock",
            "--try",
            "--timeout-exit-code",
            "--kubeconfig",
            "--context",
            "-n",
        ] {
            assert!(run.split(['\'', ' ']).any(|w| w == flag), "{flag} missing: {run}");
        }
        assert!(text.contains(r#""status --output"|"status -o") COMPREPLY=($(compgen -W 'table json yaml'"#));
        assert!(text.contains("completions) opts='--log-format --help -h'; values='bash zsh fish'"));
        assert!(text.contains(r#""status --log-format") COMPREPLY=($(compgen -W 'text json'"#));
    }

    #[test]
    fn bash_completion_runs_in_bash() {
        let Ok(out) = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{}\nCOMP_WORDS=(leasehold run --lo); COMP_CWORD=2; _leasehold leasehold --lo run; echo \"${{COMPREPLY[*]}}\"\n\
                 COMP_WORDS=(leasehold st); COMP_CWORD=1; _leasehold leasehold st leasehold; echo \"${{COMPREPLY[*]}}\"\n\
                 COMP_WORDS=(leasehold status l -o ''); COMP_CWORD=4; _leasehold leasehold '' -o; echo \"${{COMPREPLY[*]}}\"",
                script(Shell::Bash)
            ))
            .output()
        else {
            return; // no bash here
        };
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "--lock --log-format\nstatus\ntable json yaml\n"
        );
    }

    #[test]
    fn zsh_wraps_the_bash_script_and_fish_has_a_line_per_subcommand() {
        let zsh = script(Shell::Zsh);
        assert!(zsh.contains("bashcompinit") && zsh.contains("complete -o default -F _leasehold leasehold"));
        let fish = script(Shell::Fish);
        for sub in VISIBLE {
            assert!(
                fish.contains(&format!("-n __fish_use_subcommand -f -a {sub} ")),
                "{sub}:\n{fish}"
            );
        }
        assert!(
            fish.contains("-n '__fish_seen_subcommand_from run' -l lock -r"),
            "{fish}"
        );
        assert!(fish.contains("-s o -l output -x -a 'table json yaml'"), "{fish}");
    }
}
