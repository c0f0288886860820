//! A reading of Bicep templates for tests, through the tree-sitter Bicep grammar (crates.io
//! `tree-sitter-bicep`; no Bicep compiler is published to a registry we reach): declarations
//! (parameters with their decorators, variables, resources by symbolic name and type) and values
//! (literals, arrays, objects; any other expression as its source text, whitespace collapsed).
//! `Template::resolve` follows what the template alone decides: parameter values (a parameters
//! file, else the default), variables and `<resource>.<property>`.

use std::collections::BTreeMap;

use serde_json::Value as Json;
use tree_sitter::{Node, Parser};

/// A Bicep value as far as the syntax tree tells it: literals, arrays, objects (in order), or
/// the source text of any other expression.
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Str(String),
    Num(i64),
    Bool(bool),
    Null,
    Array(Vec<V>),
    Object(Vec<(String, V)>),
    Expr(String),
}

impl V {
    pub fn path(&self, dotted: &str) -> Option<&V> {
        dotted.split('.').try_fold(self, |v, key| match v {
            V::Object(props) => props.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        })
    }

    pub fn text(&self) -> String {
        match self {
            V::Str(s) | V::Expr(s) => s.clone(),
            V::Num(n) => n.to_string(),
            V::Bool(b) => b.to_string(),
            other => format!("{other:?}"),
        }
    }

    pub fn from_json(json: &Json) -> V {
        match json {
            Json::String(s) => V::Str(s.clone()),
            Json::Number(n) => V::Num(n.as_i64().expect("integer parameter")),
            Json::Bool(b) => V::Bool(*b),
            Json::Null => V::Null,
            Json::Array(items) => V::Array(items.iter().map(V::from_json).collect()),
            Json::Object(map) => V::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), V::from_json(v)))
                    .collect(),
            ),
        }
    }
}

#[derive(Debug, Default)]
pub struct Param {
    pub default: Option<V>,
    /// `@name(args)` decorators.
    pub decorators: Vec<(String, Vec<V>)>,
}

#[derive(Debug)]
pub struct Resource {
    /// `Microsoft.Web/sites` (without the API version).
    pub kind: String,
    pub body: V,
}

#[derive(Debug, Default)]
pub struct Template {
    pub params: BTreeMap<String, Param>,
    pub vars: BTreeMap<String, V>,
    pub resources: BTreeMap<String, Resource>,
    /// Parameter values from the parameters file.
    pub given: BTreeMap<String, V>,
}

fn parser() -> Parser {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_bicep::LANGUAGE.into())
        .expect("Bicep grammar loads");
    parser
}

fn named<'a>(node: Node<'a>) -> Vec<Node<'a>> {
    let mut cursor = node.walk();
    node.named_children(&mut cursor)
        .filter(|n| n.kind() != "comment")
        .collect()
}

/// Where the first syntax error is, if any.
fn first_error(node: Node, src: &str) -> Option<String> {
    if node.is_error() || node.is_missing() {
        let at = node.start_position();
        let text = &src[node.byte_range()];
        return Some(format!(
            "line {}: {:?}",
            at.row + 1,
            text.chars().take(60).collect::<String>()
        ));
    }
    let mut cursor = node.walk();
    let children: Vec<Node> = node.children(&mut cursor).collect();
    children.into_iter().find_map(|c| first_error(c, src))
}

fn unquote(text: &str) -> String {
    let inner = &text[1..text.len() - 1];
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            },
            (c, false) => out.push(c),
        }
    }
    out
}

fn value(node: Node, src: &str) -> V {
    let text = &src[node.byte_range()];
    match node.kind() {
        "string"
            if named(node)
                .iter()
                .all(|c| matches!(c.kind(), "string_content" | "escape_sequence")) =>
        {
            V::Str(unquote(text))
        }
        "number" => V::Num(text.parse().expect("integer")),
        "boolean" => V::Bool(text == "true"),
        "null" => V::Null,
        "array" => V::Array(named(node).into_iter().map(|n| value(n, src)).collect()),
        "object" => V::Object(
            named(node)
                .into_iter()
                .filter(|p| p.kind() == "object_property")
                .map(|p| {
                    let parts = named(p);
                    let key = &src[parts[0].byte_range()];
                    let key = match parts[0].kind() {
                        "string" => unquote(key),
                        _ => key.to_string(),
                    };
                    (key, value(*parts.last().unwrap(), src))
                })
                .collect(),
        ),
        _ => V::Expr(text.split_whitespace().collect::<Vec<_>>().join(" ")),
    }
}

fn decorators(node: Node, src: &str) -> Vec<(String, Vec<V>)> {
    named(node)
        .into_iter()
        .filter_map(|d| named(d).into_iter().next())
        .filter(|call| call.kind() == "call_expression")
        .map(|call| {
            let function = call.child_by_field_name("function").unwrap();
            let args = call.child_by_field_name("arguments").unwrap();
            let args = named(args).into_iter().map(|a| value(a, src)).collect();
            (src[function.byte_range()].to_string(), args)
        })
        .collect()
}

/// The template's declarations, or where it does not parse.
pub fn parse(src: &str, parameters: &str) -> Result<Template, String> {
    let tree = parser().parse(src, None).ok_or("the parser gave up")?;
    let root = tree.root_node();
    if root.has_error() {
        let at = first_error(root, src).unwrap_or_default();
        return Err(format!("main.bicep has a syntax error at {at}"));
    }
    let mut template = Template::default();
    let mut pending = Vec::new();
    for node in named(root) {
        let parts = named(node);
        let name = |i: usize| src[parts[i].byte_range()].to_string();
        match node.kind() {
            "decorators" => pending = decorators(node, src),
            "parameter_declaration" => {
                let default = (parts.len() > 2).then(|| value(parts[2], src));
                let decorators = std::mem::take(&mut pending);
                template.params.insert(
                    name(0),
                    Param {
                        default,
                        decorators,
                    },
                );
            }
            "variable_declaration" => {
                template
                    .vars
                    .insert(name(0), value(*parts.last().unwrap(), src));
            }
            "resource_declaration" => {
                let kind = unquote(&name(1));
                let kind = kind.split('@').next().unwrap().to_string();
                let body = value(*parts.last().unwrap(), src);
                template.resources.insert(name(0), Resource { kind, body });
            }
            _ => pending.clear(),
        }
    }
    let file: Json =
        serde_json::from_str(parameters).map_err(|e| format!("parameters file: {e}"))?;
    for (k, v) in file["parameters"]
        .as_object()
        .ok_or("parameters file: no parameters")?
    {
        template.given.insert(k.clone(), V::from_json(&v["value"]));
    }
    Ok(template)
}

impl Template {
    /// The one resource of `kind`: its symbolic name and body.
    pub fn one(&self, kind: &str) -> Result<(&str, &V), String> {
        let found: Vec<_> = self
            .resources
            .iter()
            .filter(|(_, r)| r.kind == kind)
            .collect();
        match found.as_slice() {
            [(name, r)] => Ok((name.as_str(), &r.body)),
            _ => Err(format!("expected one {kind}, found {}", found.len())),
        }
    }

    /// `v` as deployed, where the template alone decides it: a literal, a parameter, a variable,
    /// `<resource or variable>.<property path>`.
    pub fn resolve(&self, v: &V) -> Option<V> {
        let V::Expr(text) = v else {
            return Some(v.clone());
        };
        if let Some(given) = self.given.get(text) {
            return Some(given.clone());
        }
        if let Some(param) = self.params.get(text) {
            return self.resolve(param.default.as_ref()?);
        }
        if let Some(var) = self.vars.get(text) {
            return self.resolve(var);
        }
        let (symbol, property) = text.split_once('.')?;
        let object = match self.resources.get(symbol) {
            Some(resource) => &resource.body,
            None => self.vars.get(symbol)?,
        };
        self.resolve(object.path(property)?)
    }
}

/// Whether `v` is `want`.
pub fn is(v: Option<&V>, want: V) -> bool {
    v == Some(&want)
}

/// A string value.
pub fn str(s: &str) -> V {
    V::Str(s.into())
}
