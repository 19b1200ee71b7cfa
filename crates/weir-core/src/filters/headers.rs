//! Header rules (`request_headers` / `response_headers = { set, add, remove }`): the lines a
//! route adds to a head, rendered from templates split at load (weir-config), and the
//! variables they read. Which incoming lines are dropped is `HeaderRules::drops`; the head
//! writers (forward/request_head.rs, response_head.rs) skip those while copying the rest.

use weir_config::{HeaderRules, Template, TemplatePart, Variable};

/// What `{variable}`s expand to for one request. Built only when a route has rules.
#[derive(Clone, Copy, Default)]
pub struct Vars<'a> {
    pub scheme: &'a [u8],
    /// Host header (or absolute-form authority) as sent; empty when there is none.
    pub host: &'a [u8],
    /// The request target as routed: the normalised path (`RoutedPath`) and the query.
    pub target: &'a [u8],
    pub client_ip: &'a [u8],
    pub request_id: &'a [u8],
}

impl Vars<'_> {
    fn value(&self, var: Variable) -> &[u8] {
        let split = || self.target.iter().position(|b| *b == b'?');
        match var {
            Variable::Scheme => self.scheme,
            Variable::Host => self.host,
            Variable::Uri => self.target,
            Variable::Path => split().map_or(self.target, |q| &self.target[..q]),
            Variable::Query => split().map_or(&[][..], |q| &self.target[q + 1..]),
            Variable::ClientIp => self.client_ip,
            Variable::RequestId => self.request_id,
        }
    }
}

/// Appends the `set` lines, then the `add` lines, of `rules`.
pub fn push_rules(out: &mut Vec<u8>, rules: &HeaderRules, vars: &Vars<'_>) {
    for rule in rules.set.iter().chain(&rules.add) {
        out.extend_from_slice(rule.name.as_bytes());
        out.extend_from_slice(b": ");
        render(out, &rule.value, vars);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends the `set` lines, then the `add` lines, of `rules` to an HTTP/2 head. Names
/// and values were checked at load (tokens; visible ASCII), and variables come from a
/// parsed head, so a conversion cannot fail in practice; a value that would is skipped.
pub fn append_to_map(
    headers: &mut http::HeaderMap,
    rules: &HeaderRules,
    vars: &Vars<'_>,
    scratch: &mut Vec<u8>,
) {
    for rule in rules.set.iter().chain(&rules.add) {
        scratch.clear();
        render(scratch, &rule.value, vars);
        let name = http::HeaderName::from_bytes(rule.name.as_bytes());
        if let (Ok(name), Ok(value)) = (name, http::HeaderValue::from_bytes(scratch)) {
            headers.append(name, value);
        }
    }
}

/// Appends a template's value. Variables come from a parsed head (no CR or LF) or Weir's
/// own values, so a rendered line cannot split.
pub fn render(out: &mut Vec<u8>, template: &Template, vars: &Vars<'_>) {
    for part in &template.0 {
        match part {
            TemplatePart::Text(text) => out.extend_from_slice(text.as_bytes()),
            TemplatePart::Var(var) => out.extend_from_slice(vars.value(*var)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_config::HeaderRule;

    fn vars<'a>() -> Vars<'a> {
        Vars {
            scheme: b"http",
            host: b"example.com:8080",
            target: b"/a/b?x=1&y",
            client_ip: b"10.0.0.7",
            request_id: b"abc-1",
        }
    }

    #[test]
    fn every_variable_renders() {
        let parts = Variable::ALL
            .iter()
            .flat_map(|(_, v)| [TemplatePart::Var(*v), TemplatePart::Text("|".into())])
            .collect();
        let mut out = Vec::new();
        render(&mut out, &Template(parts), &vars());
        assert_eq!(
            out,
            b"http|example.com:8080|/a/b?x=1&y|/a/b|x=1&y|10.0.0.7|abc-1|"
        );
        let no_query = Vars {
            target: b"/p",
            ..vars()
        };
        let mut out = Vec::new();
        let t = Template(vec![
            TemplatePart::Var(Variable::Path),
            TemplatePart::Text("?".into()),
            TemplatePart::Var(Variable::Query),
        ]);
        render(&mut out, &t, &no_query);
        assert_eq!(out, b"/p?");
    }

    #[test]
    fn set_lines_come_before_add_lines() {
        let rule = |name: &str, text: &str| HeaderRule {
            name: name.into(),
            value: Template(vec![TemplatePart::Text(text.into())]),
        };
        let rules = HeaderRules {
            set: vec![rule("X-S", "1")],
            add: vec![rule("X-A", "2")],
            ..HeaderRules::default()
        };
        let mut out = Vec::new();
        push_rules(&mut out, &rules, &vars());
        assert_eq!(out, b"X-S: 1\r\nX-A: 2\r\n");
    }
}
