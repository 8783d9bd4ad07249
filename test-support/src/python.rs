//! Reading the flag tables of `python/regolith/_launch.py`, so the daemons' and the CLI's tests
//! can check every flag the Python code starts them with against their clap parsers.

use std::path::{Path, PathBuf};

/// `python/regolith/_launch.py` of this repository.
pub fn launch_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/regolith/_launch.py")
}

/// The `(keyword, flag)` pairs of the dict `NAME = {...}` at the start of a line of `text`.
/// Panics when there is no such table or it is empty.
pub fn flag_table(text: &str, name: &str) -> Vec<(String, String)> {
    let start = format!("{name} = {{");
    let at = text
        .lines()
        .position(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no table {name} in _launch.py"));
    let mut body = String::new();
    for line in text.lines().skip(at) {
        let line = line.split('#').next().unwrap_or("");
        body.push_str(line);
        if line.trim_end().ends_with('}') {
            break;
        }
    }
    let inner = body
        .split_once('{')
        .and_then(|(_, b)| b.rsplit_once('}'))
        .map(|(b, _)| b)
        .unwrap_or_else(|| panic!("table {name}: no closing brace"));
    let pairs: Vec<(String, String)> = inner
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once(':')
                .unwrap_or_else(|| panic!("table {name}: {p:?} is not KEY: VALUE"));
            (unquote(k), unquote(v))
        })
        .collect();
    assert!(!pairs.is_empty(), "table {name} is empty");
    pairs
}

/// The string constant `NAME = "..."` at the start of a line of `text`.
pub fn string_const(text: &str, name: &str) -> String {
    let start = format!("{name} = ");
    text.lines()
        .find_map(|l| l.strip_prefix(&start))
        .map(unquote)
        .unwrap_or_else(|| panic!("no constant {name} in _launch.py"))
}

/// Asserts that `text` (the Python file `file`) spells none of the long flags `longs` as a
/// string literal (`"--flag"`): it takes them from `_launch.py`.
pub fn assert_spells_none<S: AsRef<str>>(
    text: &str,
    file: &str,
    longs: impl IntoIterator<Item = S>,
) {
    for long in longs {
        let literal = format!("\"--{}\"", long.as_ref());
        assert!(!text.contains(&literal), "{file} names {literal} itself");
    }
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_of_one_or_many_lines_and_comments() {
        let text = "# x\nA = {\"dir\": \"--dir\"}\nB = {\n    # c\n    \"a_b\": \"--a-b\",\n    \"c\": \"--c\",\n}\nC = \"up\"\n";
        assert_eq!(flag_table(text, "A"), [("dir".into(), "--dir".into())]);
        assert_eq!(
            flag_table(text, "B"),
            [
                ("a_b".to_string(), "--a-b".to_string()),
                ("c".into(), "--c".into())
            ]
        );
        assert_eq!(string_const(text, "C"), "up");
        assert!(std::fs::read_to_string(launch_file())
            .unwrap()
            .contains("SIDECAR = {"));
    }
}
