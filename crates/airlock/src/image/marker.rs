//! Environment markers (PEP 508) and `requires-python` specifiers (PEP 440),
//! as far as a lock needs them: which of its packages apply to the
//! interpreter an image is built for. What this cannot evaluate is an error,
//! never a guess.

use std::cmp::Ordering;

use crate::interpreter::Interpreter;

/// The values markers compare against, for one interpreter on Linux.
#[derive(Clone, Debug)]
pub struct MarkerEnv {
    python_version: String,
    python_full_version: String,
    implementation_name: String,
    platform_machine: String,
}

impl MarkerEnv {
    pub fn of(python: &Interpreter) -> MarkerEnv {
        let mut parts = python.version.split('.');
        let short = format!("{}.{}", parts.next().unwrap_or("3"), parts.next().unwrap_or("0"));
        MarkerEnv {
            python_version: short,
            python_full_version: python.version.clone(),
            implementation_name: python.platform.implementation.clone(),
            platform_machine: python.platform.machine.clone(),
        }
    }

    fn value(&self, variable: &str) -> Option<String> {
        Some(match variable {
            "python_version" => self.python_version.clone(),
            "python_full_version" | "implementation_version" => self.python_full_version.clone(),
            "implementation_name" => self.implementation_name.clone(),
            "platform_python_implementation" => {
                if self.implementation_name == "cpython" {
                    "CPython".to_owned()
                } else {
                    self.implementation_name.clone()
                }
            }
            "platform_machine" => self.platform_machine.clone(),
            "os_name" => "posix".to_owned(),
            "sys_platform" => "linux".to_owned(),
            "platform_system" => "Linux".to_owned(),
            // A lock's packages are installed without extras or groups.
            "extra" | "extras" | "dependency_groups" => String::new(),
            _ => return None,
        })
    }
}

/// Whether `marker` holds in `env`.
pub fn evaluate(marker: &str, env: &MarkerEnv) -> Result<bool, String> {
    let tokens = tokenize(marker)?;
    let mut parser = Parser { tokens: &tokens, at: 0, env };
    let value = parser.or()?;
    if parser.at != tokens.len() {
        return Err(format!("unexpected {:?} in marker {marker:?}", tokens[parser.at]));
    }
    Ok(value)
}

/// Whether `version` satisfies a specifier set such as `>=3.11,<4`.
pub fn satisfies(version: &str, specifiers: &str) -> Result<bool, String> {
    for spec in specifiers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let op_len = spec.find(|c: char| c.is_ascii_digit() || c == '*' || c.is_whitespace()).unwrap_or(spec.len());
        let (op, wanted) = spec.split_at(op_len);
        if !compare_versions(version, op.trim(), wanted.trim())? {
            return Ok(false);
        }
    }
    Ok(true)
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Op(String),
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '(' || c == ')' {
            tokens.push(if c == '(' { Token::Open } else { Token::Close });
            i += 1;
        } else if c == '\'' || c == '"' {
            let end = chars[i + 1..]
                .iter()
                .position(|&d| d == c)
                .ok_or_else(|| format!("unterminated string in marker {text:?}"))?;
            tokens.push(Token::Quoted(chars[i + 1..i + 1 + end].iter().collect()));
            i += end + 2;
        } else if "<>=!~".contains(c) {
            let mut op = String::from(c);
            while i + op.len() < chars.len() && "=".contains(chars[i + op.len()]) {
                op.push('=');
            }
            tokens.push(Token::Op(op.clone()));
            i += op.len();
        } else if c.is_alphanumeric() || c == '_' || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                i += 1;
            }
            tokens.push(Token::Word(chars[start..i].iter().collect()));
        } else {
            return Err(format!("unexpected {c:?} in marker {text:?}"));
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    env: &'a MarkerEnv,
}

impl Parser<'_> {
    fn peek_word(&self, word: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token::Word(w)) if w == word)
    }

    fn or(&mut self) -> Result<bool, String> {
        let mut value = self.and()?;
        while self.peek_word("or") {
            self.at += 1;
            let right = self.and()?;
            value = value || right;
        }
        Ok(value)
    }

    fn and(&mut self) -> Result<bool, String> {
        let mut value = self.atom()?;
        while self.peek_word("and") {
            self.at += 1;
            let right = self.atom()?;
            value = value && right;
        }
        Ok(value)
    }

    fn atom(&mut self) -> Result<bool, String> {
        if self.tokens.get(self.at) == Some(&Token::Open) {
            self.at += 1;
            let value = self.or()?;
            if self.tokens.get(self.at) != Some(&Token::Close) {
                return Err("a '(' in the marker is never closed".to_owned());
            }
            self.at += 1;
            return Ok(value);
        }
        let (left, left_is_variable) = self.operand()?;
        let op = match self.tokens.get(self.at) {
            Some(Token::Op(op)) => {
                self.at += 1;
                op.clone()
            }
            Some(Token::Word(w)) if w == "in" => {
                self.at += 1;
                "in".to_owned()
            }
            Some(Token::Word(w))
                if w == "not" && matches!(self.tokens.get(self.at + 1), Some(Token::Word(i)) if i == "in") =>
            {
                self.at += 2;
                "not in".to_owned()
            }
            other => return Err(format!("expected a comparison in the marker, found {other:?}")),
        };
        let (right, right_is_variable) = self.operand()?;
        let version_variable = |is_var: bool, text: &str| is_var && text.contains('.');
        match op.as_str() {
            "in" => Ok(right.contains(&left)),
            "not in" => Ok(!right.contains(&left)),
            "==" | "!="
                if !(version_variable(left_is_variable, &left) || version_variable(right_is_variable, &right)) =>
            {
                Ok((left == right) == (op == "=="))
            }
            _ => compare_versions(&left, &op, &right),
        }
    }

    /// A quoted string, or a variable's value (and whether it was one).
    fn operand(&mut self) -> Result<(String, bool), String> {
        match self.tokens.get(self.at) {
            Some(Token::Quoted(s)) => {
                self.at += 1;
                Ok((s.clone(), false))
            }
            Some(Token::Word(w)) => {
                self.at += 1;
                let value = self.env.value(w).ok_or_else(|| format!("the marker variable {w:?} is not known"))?;
                Ok((value, true))
            }
            other => Err(format!("expected a value in the marker, found {other:?}")),
        }
    }
}

/// `version OP wanted` with PEP 440 semantics for release numbers
/// (`3.11.7 >= 3.11`, `==3.11.*`, `~=3.10`). Pre-releases compare by their
/// release part.
fn compare_versions(version: &str, op: &str, wanted: &str) -> Result<bool, String> {
    if let Some(prefix) = wanted.strip_suffix(".*") {
        let matches = {
            let want = release(prefix)?;
            let have = release(version)?;
            have.len() >= want.len() && have[..want.len()] == want[..]
        };
        return match op {
            "==" => Ok(matches),
            "!=" => Ok(!matches),
            _ => Err(format!("{op}{wanted} is not a valid specifier")),
        };
    }
    let ordering = cmp_release(&release(version)?, &release(wanted)?);
    Ok(match op {
        "==" | "===" => ordering == Ordering::Equal,
        "!=" => ordering != Ordering::Equal,
        "<" => ordering == Ordering::Less,
        "<=" => ordering != Ordering::Greater,
        ">" => ordering == Ordering::Greater,
        ">=" => ordering != Ordering::Less,
        "~=" => {
            let want = release(wanted)?;
            if want.len() < 2 {
                return Err(format!("~={wanted} needs at least two parts"));
            }
            let have = release(version)?;
            ordering != Ordering::Less
                && have.len() >= want.len() - 1
                && have[..want.len() - 1] == want[..want.len() - 1]
        }
        other => return Err(format!("{other:?} is not a comparison")),
    })
}

fn release(version: &str) -> Result<Vec<u64>, String> {
    let digits: String = version.trim().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let parts: Result<Vec<u64>, _> = digits.trim_end_matches('.').split('.').map(str::parse).collect();
    parts.map_err(|_| format!("{version:?} is not a version"))
}

fn cmp_release(a: &[u64], b: &[u64]) -> Ordering {
    let len = a.len().max(b.len());
    (0..len).map(|i| a.get(i).unwrap_or(&0).cmp(b.get(i).unwrap_or(&0))).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::Platform;

    fn env() -> MarkerEnv {
        MarkerEnv::of(&Interpreter {
            executable: "/usr/bin/python3".into(),
            base_prefix: "/usr".into(),
            prefix: "/usr".into(),
            version: "3.11.7".into(),
            platform: Platform {
                implementation: "cpython".into(),
                machine: "x86_64".into(),
                libc: "glibc".into(),
                libc_version: "2.36".into(),
                abiflags: String::new(),
            },
        })
    }

    #[test]
    fn markers_evaluate_as_pip_would() {
        let cases = [
            ("sys_platform == 'win32'", false),
            ("sys_platform == 'linux' and python_version >= '3.11'", true),
            ("python_version < '3.10' or platform_machine == 'x86_64'", true),
            ("(python_full_version >= '3.12' or os_name == 'nt') and implementation_name == 'cpython'", false),
            ("platform_python_implementation != 'PyPy'", true),
            ("'linux' in sys_platform", true),
            ("python_version not in '3.8, 3.9'", true),
            ("python_version == '3.11.*'", true),
            ("extra == 'test'", false),
        ];
        for (marker, expected) in cases {
            assert_eq!(evaluate(marker, &env()), Ok(expected), "{marker}");
        }
        for bad in ["platform_release >= '6'", "python_version >=", "(sys_platform == 'linux'", "x = 'y'"] {
            assert!(evaluate(bad, &env()).is_err(), "{bad}");
        }
    }

    #[test]
    fn specifiers_are_release_comparisons() {
        assert_eq!(satisfies("3.11.7", ">=3.11"), Ok(true));
        assert_eq!(satisfies("3.11.7", ">=3.11, <3.12"), Ok(true));
        assert_eq!(satisfies("3.10.2", ">=3.11"), Ok(false));
        assert_eq!(satisfies("3.11.7", "~=3.10"), Ok(true));
        assert_eq!(satisfies("3.11.7", "!=3.11.*"), Ok(false));
        assert_eq!(satisfies("3.13.0rc1", ">=3.13"), Ok(true));
        assert!(satisfies("3.11.7", ">=x").is_err());
    }
}
