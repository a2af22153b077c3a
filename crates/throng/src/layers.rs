//! `throng serve`'s settings from three places, a layer around its clap
//! definition rather than a second one: a TOML file (`--config FILE` or
//! `THRONG_CONFIG`; keys are the long option names, a repeatable option
//! takes an array), `THRONG_<OPTION>` environment variables, and the
//! flags. Flags override the environment, which overrides the file: the
//! file's values become the options' defaults and the environment is
//! clap's own `env`, so clap's precedence is the rule. What each value is
//! and where it came from is kept for `serve --print-config`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command, CommandFactory, FromArgMatches};

/// Options that are not settings: never from the file or the environment
/// (`worker-index` is how the supervisor starts a worker, and workers
/// inherit its environment).
const NOT_SETTINGS: &[&str] = &["worker-index", "config", "help", "version", "print-config"];

/// Why the settings file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LayerError {
    /// The file could not be read.
    #[error("cannot read the settings file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML.
    #[error("{path} is not TOML: {why}")]
    Toml { path: PathBuf, why: String },
    /// A key that names no option of `serve`.
    #[error(
        "{path}: '{key}' is not an option of throng serve (keys are the long option names \
         without '--', e.g. max-connections = 100000; see throng serve --help)"
    )]
    UnknownKey { path: PathBuf, key: String },
    /// A value of a type no option takes.
    #[error(
        "{path}: '{key}' must be a string, number, boolean or an array of them (a repeatable option)"
    )]
    BadValue { path: PathBuf, key: String },
}

/// The environment variable of option `long`: `THRONG_MAX_CONNECTIONS`.
pub(crate) fn env_name(long: &str) -> String {
    format!("THRONG_{}", long.to_uppercase().replace('-', "_"))
}

/// The settings file `argv` names (`--config FILE`, `--config=FILE`), else `THRONG_CONFIG`.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("THRONG_CONFIG").map(PathBuf::from)
}

/// The file's values by key, each as the text a flag would take.
fn read_file(path: &Path) -> Result<BTreeMap<String, Vec<String>>, LayerError> {
    let text = std::fs::read_to_string(path).map_err(|source| LayerError::Read {
        path: path.to_owned(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| LayerError::Toml {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
    let bad = |key: &str| LayerError::BadValue {
        path: path.to_owned(),
        key: key.to_owned(),
    };
    let mut values = BTreeMap::new();
    for (key, value) in table {
        let texts = match &value {
            toml::Value::Array(items) => items
                .iter()
                .map(|v| scalar(v).ok_or_else(|| bad(&key)))
                .collect::<Result<Vec<_>, _>>()?,
            v => vec![scalar(v).ok_or_else(|| bad(&key))?],
        };
        values.insert(key, texts);
    }
    Ok(values)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `serve`'s options with the file's values as defaults and each one's
/// environment variable.
fn layer(
    serve: Command,
    file: &BTreeMap<String, Vec<String>>,
    path: Option<&Path>,
) -> Result<Command, LayerError> {
    let known: Vec<String> = serve
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .filter(|l| !NOT_SETTINGS.contains(&l.as_str()))
        .collect();
    if let Some(key) = file.keys().find(|k| !known.contains(k)) {
        return Err(LayerError::UnknownKey {
            path: path.map(Path::to_path_buf).unwrap_or_default(),
            key: key.clone(),
        });
    }
    Ok(serve.mut_args(|a: Arg| {
        let Some(long) = a.get_long().map(str::to_owned) else {
            return a;
        };
        if NOT_SETTINGS.contains(&long.as_str()) && long != "config" {
            return a;
        }
        let a = a.env(env_name(&long)).hide_env_values(true);
        match file.get(&long) {
            Some(values) => a.default_values(values.clone()),
            None => a,
        }
    }))
}

/// Parses the command line as `C` (exiting with clap's message on a bad
/// one); for `serve`, with the file and environment layered under the
/// flags, and the text `--print-config` shows.
pub(crate) fn parse<C: CommandFactory + FromArgMatches>() -> Result<(C, String), LayerError> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let serving = argv.get(1).is_some_and(|a| a == "serve")
        && !argv
            .iter()
            .any(|a| a.to_str().is_some_and(|s| s.starts_with("--worker-index")));
    if !serving {
        let matches = C::command().get_matches_from(&argv);
        return Ok((
            C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()),
            String::new(),
        ));
    }
    let path = config_path(&argv);
    let file = match &path {
        Some(p) => read_file(p)?,
        None => BTreeMap::new(),
    };
    let mut failed = None;
    let cmd = C::command().mut_subcommand("serve", |serve| {
        match layer(serve.clone(), &file, path.as_deref()) {
            Ok(layered) => layered,
            Err(e) => {
                failed = Some(e);
                serve
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let serve = cmd
        .find_subcommand("serve")
        .cloned()
        .unwrap_or_else(|| Command::new("serve"));
    let matches = cmd.get_matches_from(&argv);
    let cli = C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let shown = matches
        .subcommand_matches("serve")
        .map(|m| show(&serve, m, &file, path.as_deref()))
        .unwrap_or_default();
    Ok((cli, shown))
}

/// Every setting of `serve` with its value and where it came from, as a
/// TOML file `--config` reads back.
fn show(
    serve: &Command,
    m: &ArgMatches,
    file: &BTreeMap<String, Vec<String>>,
    path: Option<&Path>,
) -> String {
    let mut out = String::new();
    for a in serve.get_arguments() {
        let Some(long) = a.get_long() else { continue };
        if a.is_hide_set() || NOT_SETTINGS.contains(&long) || long == "dry-run" {
            continue;
        }
        let id = a.get_id().as_str();
        let values: Vec<String> = m
            .get_raw(id)
            .map(|v| v.map(|s| mask(&s.to_string_lossy())).collect())
            .unwrap_or_default();
        let from = match m.value_source(id) {
            Some(ValueSource::CommandLine) => format!("flag --{long}"),
            Some(ValueSource::EnvVariable) => format!("environment {}", env_name(long)),
            Some(ValueSource::DefaultValue) if file.contains_key(long) => format!(
                "file {}",
                path.map(|p| p.display().to_string()).unwrap_or_default()
            ),
            Some(ValueSource::DefaultValue) => "default".to_owned(),
            _ => "unset".to_owned(),
        };
        let value = match values.as_slice() {
            [] => {
                let _ = writeln!(out, "# {long} (unset)");
                continue;
            }
            [one] if !repeats(a) => quote(one),
            many => format!(
                "[{}]",
                many.iter().map(|v| quote(v)).collect::<Vec<_>>().join(", ")
            ),
        };
        let _ = writeln!(out, "{long} = {value}  # {from}");
    }
    out
}

fn repeats(a: &Arg) -> bool {
    matches!(a.get_action(), clap::ArgAction::Append) || a.get_value_delimiter().is_some()
}

/// A value as TOML: numbers and booleans bare, the rest quoted.
fn quote(v: &str) -> String {
    if v == "true" || v == "false" || v.parse::<f64>().is_ok() {
        v.to_owned()
    } else {
        format!("{v:?}")
    }
}

/// A URL's password as `***` (`redis://user:secret@host` shows as `redis://user:***@host`).
fn mask(v: &str) -> String {
    let Some((scheme, rest)) = v.split_once("://") else {
        return v.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return v.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_values_and_masks() {
        assert_eq!(env_name("max-connections"), "THRONG_MAX_CONNECTIONS");
        assert_eq!(mask("redis://u:pw@h:6379/0"), "redis://u:***@h:6379/0");
        assert_eq!(mask("redis://pw@h"), "redis://***@h");
        assert_eq!(mask("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(quote("10"), "10");
        assert_eq!(quote("10s"), "\"10s\"");
        let argv: Vec<OsString> = ["throng", "serve", "--config=/x.toml"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(config_path(&argv), Some(PathBuf::from("/x.toml")));
    }
}
