//! The Go-template subset our chart templates are written in, parsed and rendered in Rust.
//!
//! Helm is not a Rust library and a full Go `text/template` is far more than the chart needs, so
//! the templates keep to a subset small enough to implement exactly, and the Go conformance test
//! (tests/conformance/deploy) renders the chart with Helm's own engine and requires byte-equal
//! output. The subset:
//!
//! - text, passed through unchanged;
//! - `{{ .Values.a.b }}`, `{{ .Release.Name }}`, `{{ .Chart.AppVersion }}`: a field path, printed
//!   the way Helm prints it (strings as-is, booleans, integers below 10^6: Helm reads values
//!   through JSON, so larger numbers would print in exponent form, and are refused here);
//! - `{{ if PATH }} … {{ else }} … {{ end }}` with Go's truthiness (false, 0, "", empty map or
//!   list are false);
//! - `{{/* comments */}}`;
//! - the trim markers `{{- ` and ` -}}`, which remove all whitespace before or after the action.
//!
//! Anything else (functions, pipes, variables, `range`, `include`) is refused with the template
//! and line, so the subset cannot grow by accident. A missing key is an error, as in Helm's strict
//! mode, so a typo in a template never renders as an empty string.

use serde_yaml_ng::Value;

/// Why a template could not be parsed or rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("{template}:{line}: action opened with `{{{{` is never closed")]
    Unclosed { template: String, line: usize },
    #[error(
        "{template}:{line}: `{{{{{action}}}}}` is outside the supported template subset \
         (field paths, if/else/end, comments; see xtask/src/chart/template.rs)"
    )]
    Unsupported {
        template: String,
        line: usize,
        action: String,
    },
    #[error("{template}:{line}: `{{{{{keyword}}}}}` without a matching `if`")]
    Unbalanced {
        template: String,
        line: usize,
        keyword: String,
    },
    #[error("{template}:{line}: `if` is never closed with `end`")]
    UnclosedIf { template: String, line: usize },
    #[error(
        "{template}:{line}: `{path}` has no value (a missing key is an error, as in `helm --strict`)"
    )]
    Missing {
        template: String,
        line: usize,
        path: String,
    },
    #[error("{template}:{line}: `{path}` is {what}, which the template subset cannot print")]
    NotPrintable {
        template: String,
        line: usize,
        path: String,
        what: String,
    },
}

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    name: String,
    nodes: Vec<Node>,
}

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Field {
        path: FieldPath,
        line: usize,
    },
    If {
        cond: FieldPath,
        line: usize,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

/// `.A.b.c` as its segments.
#[derive(Debug, Clone)]
struct FieldPath(Vec<String>);

impl FieldPath {
    fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix('.')?;
        let segments: Vec<String> = rest.split('.').map(str::to_owned).collect();
        let valid = |seg: &String| {
            !seg.is_empty()
                && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !seg.starts_with(|c: char| c.is_ascii_digit())
        };
        segments.iter().all(valid).then_some(Self(segments))
    }

    fn show(&self) -> String {
        format!(".{}", self.0.join("."))
    }
}

/// One lexed piece of a template: text, or the body of an action with its line.
#[derive(Debug)]
enum Token {
    Text(String),
    Action { body: String, line: usize },
}

impl Template {
    /// Parses `source`; `name` is used in error messages.
    pub fn parse(name: &str, source: &str) -> Result<Self, TemplateError> {
        let tokens = lex(name, source)?;
        let mut iter = tokens.into_iter();
        let (nodes, end) = parse_nodes(name, &mut iter)?;
        if let Some((keyword, line)) = end {
            return Err(TemplateError::Unbalanced {
                template: name.to_owned(),
                line,
                keyword,
            });
        }
        Ok(Self {
            name: name.to_owned(),
            nodes,
        })
    }

    /// Renders the template against `root`, a mapping with `Values`, `Release` and `Chart`.
    pub fn render(&self, root: &Value) -> Result<String, TemplateError> {
        let mut out = String::new();
        self.render_nodes(&self.nodes, root, &mut out)?;
        Ok(out)
    }

    fn render_nodes(
        &self,
        nodes: &[Node],
        root: &Value,
        out: &mut String,
    ) -> Result<(), TemplateError> {
        for node in nodes {
            match node {
                Node::Text(text) => out.push_str(text),
                Node::Field { path, line } => {
                    let value = self.lookup(root, path, *line)?;
                    out.push_str(&self.print(value, path, *line)?);
                }
                Node::If {
                    cond,
                    line,
                    then,
                    otherwise,
                } => {
                    let branch = if truthy(self.lookup(root, cond, *line)?) {
                        then
                    } else {
                        otherwise
                    };
                    self.render_nodes(branch, root, out)?;
                }
            }
        }
        Ok(())
    }

    fn lookup<'v>(
        &self,
        root: &'v Value,
        path: &FieldPath,
        line: usize,
    ) -> Result<&'v Value, TemplateError> {
        let mut value = root;
        for segment in &path.0 {
            value = value
                .as_mapping()
                .and_then(|m| m.get(segment.as_str()))
                .ok_or_else(|| TemplateError::Missing {
                    template: self.name.clone(),
                    line,
                    path: path.show(),
                })?;
        }
        Ok(value)
    }

    fn print(&self, value: &Value, path: &FieldPath, line: usize) -> Result<String, TemplateError> {
        let refuse = |what: &str| TemplateError::NotPrintable {
            template: self.name.clone(),
            line,
            path: path.show(),
            what: what.to_owned(),
        };
        match value {
            Value::String(s) => Ok(s.clone()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => match n.as_i64() {
                // Helm reads values into float64 and prints with %v, which switches to exponent
                // form at 10^6; below that both print the plain integer.
                Some(i) if i.unsigned_abs() < 1_000_000 => Ok(i.to_string()),
                Some(_) => Err(refuse("an integer of 10^6 or more (quote it)")),
                None => Err(refuse("a non-integer number (quote it)")),
            },
            Value::Null => Err(refuse("null")),
            Value::Sequence(_) => Err(refuse("a list")),
            Value::Mapping(_) => Err(refuse("a mapping")),
            Value::Tagged(_) => Err(refuse("a tagged value")),
        }
    }
}

/// Go's truthiness for `if`: the zero value and empty collections are false.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        Value::Tagged(t) => truthy(&t.value),
    }
}

/// Splits the source into text and action bodies, applying the trim markers to the text. The
/// rules are Go's (text/template/parse/lex.go): a left trim marker is `-` plus one whitespace
/// character right after `{{`; a right one is one whitespace character plus `-` right before
/// `}}`; a comment starts right after `{{` or the left marker and ends right before `}}` or the
/// right marker.
fn lex(name: &str, source: &str) -> Result<Vec<Token>, TemplateError> {
    let mut tokens = Vec::new();
    let mut rest = source;
    let mut line = 1;
    let mut trim_next_text = false;
    loop {
        let open = rest.find("{{");
        let raw = &rest[..open.unwrap_or(rest.len())];
        // Trimmed newlines still advance the line number of what follows.
        line += raw.matches('\n').count();
        let mut text = raw;
        if trim_next_text {
            text = text.trim_start_matches(is_space);
        }
        let Some(open) = open else {
            push_text(&mut tokens, text);
            break;
        };
        let after = &rest[open + 2..];
        let trim_left = after.starts_with('-') && after[1..].starts_with(is_space);
        if trim_left {
            text = text.trim_end_matches(is_space);
        }
        push_text(&mut tokens, text);
        let action_line = line;
        let unclosed = || TemplateError::Unclosed {
            template: name.to_owned(),
            line: action_line,
        };
        let inner = if trim_left { &after[2..] } else { after };
        let (body, trim_right, consumed) = if let Some(comment) = inner.strip_prefix("/*") {
            let close = comment.find("*/").ok_or_else(unclosed)? + 4;
            let tail = &inner[close..];
            let trim_right = tail.starts_with(is_space) && tail[1..].starts_with("-}}");
            if !trim_right && !tail.starts_with("}}") {
                return Err(TemplateError::Unsupported {
                    template: name.to_owned(),
                    line: action_line,
                    action: inner[..close].to_owned(),
                });
            }
            (None, trim_right, close + if trim_right { 4 } else { 2 })
        } else {
            let end = inner.find("}}").ok_or_else(unclosed)?;
            let body = &inner[..end];
            let trim_right = body.ends_with('-') && body[..body.len() - 1].ends_with(is_space);
            let body = if trim_right {
                &body[..body.len() - 2]
            } else {
                body
            };
            (Some(body), trim_right, end + 2)
        };
        line += inner[..consumed].matches('\n').count();
        if let Some(body) = body {
            tokens.push(Token::Action {
                body: body.trim_matches(is_space).to_owned(),
                line: action_line,
            });
        }
        trim_next_text = trim_right;
        rest = &inner[consumed..];
    }
    Ok(tokens)
}

fn push_text(tokens: &mut Vec<Token>, text: &str) {
    if !text.is_empty() {
        tokens.push(Token::Text(text.to_owned()));
    }
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// The keyword (`else` or `end`) that closed a block, and its line.
type Closer = Option<(String, usize)>;

/// Parses nodes until the tokens run out or an `else`/`end` closes the current block, which is
/// returned with its line.
fn parse_nodes(
    name: &str,
    tokens: &mut impl Iterator<Item = Token>,
) -> Result<(Vec<Node>, Closer), TemplateError> {
    let mut nodes = Vec::new();
    while let Some(token) = tokens.next() {
        let (body, line) = match token {
            Token::Text(text) => {
                nodes.push(Node::Text(text));
                continue;
            }
            Token::Action { body, line } => (body, line),
        };
        let unsupported = || TemplateError::Unsupported {
            template: name.to_owned(),
            line,
            action: body.clone(),
        };
        let words: Vec<&str> = body.split_whitespace().collect();
        match words.as_slice() {
            ["else"] | ["end"] => return Ok((nodes, Some((body.clone(), line)))),
            ["if", cond] => {
                let cond = FieldPath::parse(cond).ok_or_else(unsupported)?;
                let (then, end) = parse_nodes(name, tokens)?;
                let (otherwise, end) = match end {
                    Some((k, _)) if k == "else" => parse_nodes(name, tokens)?,
                    other => (Vec::new(), other),
                };
                match end {
                    Some((k, _)) if k == "end" => {}
                    Some((keyword, line)) => {
                        return Err(TemplateError::Unbalanced {
                            template: name.to_owned(),
                            line,
                            keyword,
                        });
                    }
                    None => {
                        return Err(TemplateError::UnclosedIf {
                            template: name.to_owned(),
                            line,
                        });
                    }
                }
                nodes.push(Node::If {
                    cond,
                    line,
                    then,
                    otherwise,
                });
            }
            [path] => {
                let path = FieldPath::parse(path).ok_or_else(unsupported)?;
                nodes.push(Node::Field { path, line });
            }
            _ => return Err(unsupported()),
        }
    }
    Ok((nodes, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Value {
        serde_yaml_ng::from_str(
            "Values:\n  image: {repository: example/resmgr, tag: '1.2.3'}\n  port: 8891\n  \
             on: true\n  off: false\n  empty: ''\n  big: 1000000\n  ratio: 0.5\n  list: []\n  \
             map: {a: 1}\nRelease: {Name: resmgr, Namespace: kube-system}\n",
        )
        .unwrap()
    }

    fn render(src: &str) -> Result<String, TemplateError> {
        Template::parse("t.yaml", src)?.render(&root())
    }

    #[test]
    fn substitutes_field_paths_and_prints_scalars_like_helm() {
        assert_eq!(
            render("image: {{ .Values.image.repository }}:{{ .Values.image.tag }}\n").unwrap(),
            "image: example/resmgr:1.2.3\n"
        );
        assert_eq!(
            render("{{.Values.port}} {{ .Values.on }} {{ .Release.Namespace }}").unwrap(),
            "8891 true kube-system"
        );
    }

    #[test]
    fn trim_markers_remove_all_adjacent_whitespace() {
        assert_eq!(
            render("a: 1\n\n  {{- .Values.port }}\n").unwrap(),
            "a: 18891\n"
        );
        assert_eq!(render("x {{ .Values.port -}}\n\n  y").unwrap(), "x 8891y");
        // A dash without a following space is not a trim marker (Go reads `-3` as a number).
        assert!(matches!(
            render("a {{-3}}"),
            Err(TemplateError::Unsupported { .. })
        ));
    }

    #[test]
    fn if_else_end_follow_go_truthiness() {
        let src = "{{ if .Values.X }}yes{{ else }}no{{ end }}";
        for (key, want) in [
            ("on", "yes"),
            ("off", "no"),
            ("empty", "no"),
            ("list", "no"),
            ("map", "yes"),
            ("port", "yes"),
        ] {
            assert_eq!(render(&src.replace('X', key)).unwrap(), want, "{key}");
        }
        assert_eq!(
            render("{{- if .Values.on }}\nkind: A\n{{- end }}\n").unwrap(),
            "\nkind: A\n"
        );
        assert_eq!(
            render("{{ if .Values.on }}{{ if .Values.off }}a{{ else }}b{{ end }}{{ end }}")
                .unwrap(),
            "b"
        );
    }

    #[test]
    fn comments_render_nothing_even_with_braces_inside() {
        assert_eq!(render("a\n{{- /* says }} and {{ */ -}}\nb").unwrap(), "ab");
        assert_eq!(render("{{/* plain */}}x").unwrap(), "x");
    }

    #[test]
    fn refuses_everything_outside_the_subset_with_the_line() {
        for action in [
            "{{ .Values.port | quote }}",
            "{{ include \"x\" . }}",
            "{{ range .Values.list }}{{ end }}",
            "{{ $x := 1 }}",
            "{{ toYaml .Values.map }}",
            "{{ .Values..port }}",
        ] {
            let err = render(&format!("a\nb\n{action}")).unwrap_err();
            assert!(
                matches!(err, TemplateError::Unsupported { line: 3, .. }),
                "{action}: {err:?}"
            );
        }
    }

    #[test]
    fn missing_keys_and_unprintable_values_are_errors_naming_the_path() {
        let err = render("\n{{ .Values.image.digest }}").unwrap_err();
        assert_eq!(
            err,
            TemplateError::Missing {
                template: "t.yaml".into(),
                line: 2,
                path: ".Values.image.digest".into()
            }
        );
        for key in ["big", "ratio", "map", "list"] {
            let err = render(&format!("{{{{ .Values.{key} }}}}")).unwrap_err();
            assert!(
                matches!(err, TemplateError::NotPrintable { ref path, .. } if path.ends_with(key)),
                "{key}: {err:?}"
            );
        }
        assert!(matches!(
            render("{{ if .Values.nope }}x{{ end }}"),
            Err(TemplateError::Missing { .. })
        ));
    }

    #[test]
    fn unbalanced_blocks_are_errors() {
        assert!(matches!(
            render("{{ end }}"),
            Err(TemplateError::Unbalanced { .. })
        ));
        assert!(matches!(
            render("x\n{{ if .Values.on }}y"),
            Err(TemplateError::UnclosedIf { line: 2, .. })
        ));
        assert!(matches!(
            render("{{ if .Values.on }}a{{ else }}b{{ else }}c{{ end }}"),
            Err(TemplateError::Unbalanced { .. })
        ));
        assert!(matches!(
            render("a {{ .Values.port"),
            Err(TemplateError::Unclosed { line: 1, .. })
        ));
    }

    #[test]
    fn line_numbers_count_trimmed_newlines() {
        let err = render("a\n\n\n{{- .Values.nope }}").unwrap_err();
        assert!(
            matches!(err, TemplateError::Missing { line: 4, .. }),
            "{err:?}"
        );
    }
}
