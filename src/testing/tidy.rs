//! The house rules as a test (as TigerBeetle's tidy checks its tree): every file of
//! `src/` opens with module docs saying what it owns; no function of shipped code runs
//! over [`MAX_FN_LINES`] lines; CONTRIBUTING's map names every folder of `src/`. Test
//! code (modules declared under `#[cfg(test)]`, and everything beneath them) may have
//! longer functions.

use std::path::{Path, PathBuf};

/// The longest a function of shipped code may be, its signature and braces included.
const MAX_FN_LINES: usize = 80;

/// `src/`'s `.rs` files and folders, sorted.
fn walk(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read a folder of src/")
        .map(|e| e.expect("a folder entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            dirs.push(path.clone());
            walk(&path, files, dirs);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// Whether `line` is an attribute that compiles what follows for tests only.
fn test_only_attribute(line: &str) -> bool {
    let l = line.trim();
    l.starts_with("#[cfg(test)]") || l.starts_with("#[cfg(all(test")
}

/// The module `line` declares, if it declares one (`mod x;` or `mod x {`).
fn declared_module(line: &str) -> Option<(&str, bool)> {
    let l = line.trim();
    let l = l.strip_prefix("pub(crate) ").or(l.strip_prefix("pub ")).unwrap_or(l);
    let rest = l.strip_prefix("mod ")?;
    let name_end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    let inline = rest[name_end..].trim_start().starts_with('{');
    Some((&rest[..name_end], inline))
}

/// Where the modules a file declares live: beside it for `lib.rs`, `main.rs` and
/// `mod.rs`, else in the folder of its name.
fn module_base(file: &Path) -> PathBuf {
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    if matches!(stem, "lib" | "main" | "mod") {
        file.parent().expect("a file has a folder").to_path_buf()
    } else {
        file.with_extension("")
    }
}

/// The paths (without `.rs`) of the modules declared for tests only, from `files`.
fn test_modules(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.windows(2) {
            if let (true, Some((name, false))) = (test_only_attribute(pair[0]), declared_module(pair[1])) {
                out.push(module_base(file).join(name));
            }
        }
    }
    out
}

/// `line` with string and character literals emptied and its comment cut.
fn code_of(line: &str) -> String {
    let (mut out, mut chars) = (String::new(), line.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                out.push_str("\"\"");
            }
            '\'' if matches!(chars.clone().nth(1), Some('\'')) || chars.peek() == Some(&'\\') => {
                // A character literal ('{', '\n'); a lifetime has no closing quote.
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// Whether `line` starts a function item (`fn`, with any visibility and qualifiers).
fn starts_fn(line: &str) -> bool {
    let mut l = line.trim_start();
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
        l = l.strip_prefix(prefix).unwrap_or(l);
    }
    l.starts_with("fn ")
}

/// The functions of `text` over [`MAX_FN_LINES`] lines (name line, length), skipping
/// inline test modules.
fn long_functions(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<String> = text.lines().map(code_of).collect();
    let mut out = Vec::new();
    let mut i = 0;
    // The line after the item that starts at `from` closes (or ends with `;`).
    let item_end = |from: usize| {
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(from) {
            depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
            opened |= l.contains('{');
            if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                return j + 1;
            }
        }
        lines.len()
    };
    while i < lines.len() {
        let inline_test = test_only_attribute(&lines[i])
            && lines
                .get(i + 1)
                .and_then(|l| declared_module(l))
                .is_some_and(|(_, inline)| inline);
        if inline_test {
            i = item_end(i + 1);
        } else if starts_fn(&lines[i]) {
            let end = item_end(i);
            if end - i > MAX_FN_LINES {
                out.push((i + 1, end - i));
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_file_opens_with_module_docs() {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&src(), &mut files, &mut dirs);
    let undocumented: Vec<_> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("read a source file");
            !text
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.starts_with("//!"))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "files without module docs (`//!`): {undocumented:?}"
    );
}

#[test]
fn no_function_of_shipped_code_runs_over_the_bound() {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&src(), &mut files, &mut dirs);
    let tests = test_modules(&files);
    let is_test = |f: &Path| {
        let base = f.with_extension("");
        tests.iter().any(|t| base == *t || f.starts_with(t))
    };
    let mut long = Vec::new();
    for file in files.iter().filter(|f| !is_test(f)) {
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (line, n) in long_functions(&text) {
            long.push(format!("{}:{line} ({n} lines)", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "functions of shipped code over {MAX_FN_LINES} lines: {long:#?}"
    );
    // The rule can fail: a test module is found as such, and a long function is seen.
    assert!(
        tests.iter().any(|t| t.ends_with("explore")),
        "no test module found: {tests:?}"
    );
    let padded = format!("fn long() {{\n{}}}\n", "    let x = 1;\n".repeat(MAX_FN_LINES));
    assert_eq!(long_functions(&padded), vec![(1, MAX_FN_LINES + 2)]);
}

#[test]
fn the_contributing_map_names_every_folder_of_src() {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&src(), &mut files, &mut dirs);
    let contributing = std::fs::read_to_string(src().join("../CONTRIBUTING.md")).expect("read CONTRIBUTING.md");
    let map = contributing
        .split("## Where things live")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("CONTRIBUTING.md's map: a code block under '## Where things live'");
    let missing: Vec<String> = dirs
        .iter()
        .map(|d| d.strip_prefix(src()).expect("under src/"))
        .filter(|rel| {
            let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let top = rel.components().count() == 1;
            let named = |l: &str| {
                let l = l.trim_start();
                if top {
                    l.starts_with(&format!("src/{name}/"))
                } else {
                    l.starts_with(&format!("{name}/"))
                }
            };
            !map.lines().any(named)
        })
        .map(|rel| rel.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "folders of src/ CONTRIBUTING's map does not name: {missing:?}"
    );
}
