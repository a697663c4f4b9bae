"""${VAR} and ${VAR:-fallback} references in the path fields of a recipe: expanded once, at load
(`ExperimentConfig.validate`, `DistillConfig.validate`), read by every layer through `resolved`, and the
fix of an unset variable derived from the field it feeds."""

from __future__ import annotations

import os
import re

from wamkit.errors import ConfigError


_ENV_REF = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")
_VAR_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")

# The fields whose ${VAR} references are expanded, and what each must point at: the fix of an unset
# variable is derived from the field it feeds, never from the variable's name.
ENV_PATH_FIELDS = {
    "data.path": ("/path/to/dataset", "a LeRobot v3.0 dataset root or a sim-bimanual bundle directory; "
                  "`wamkit data synth <schema> DIR` writes a synthetic one"),
    "data.keep_ranges_path": ("/path/to/keep_ranges.json", "a keep-ranges JSON file; or --set data.keep_ranges_path='' "
                              "to train on every window"),
    "data.latent_cache": ("/path/to/latent_cache", "a directory written by `wamkit data cache-latents`; or "
                          "--set data.latent_cache='' to decode video"),
    "model.vae_path": ("/path/to/wan22_vae", "a diffusers AutoencoderKLWan directory: config.json + safetensors"),
    "model.text_tokenizer_path": ("/path/to/tokenizer", 'a tokenizer directory (e.g. <Cosmos3-Nano diffusers dir>/tokenizer), '
                                  'or "byte"'),
    "checkpoint.load_path": ("/path/to/Cosmos3-Nano", "a Cosmos3 diffusers dir or reference safetensors, or a wamkit "
                             "runs/<name>/checkpoints/iter_<N> dir; for random init (wamkit train) export {var}= (empty) "
                             "or --set checkpoint.load_path=''"),
}
_DISTILL_FIX = ("runs/<name>/checkpoints/iter_<N>", "a completed wamkit iteration directory of the previous stage")


def expand_fields(node, section: str, keys) -> dict[str, str]:
    """Expand the ${VAR} references of `node`'s fields `keys` (config section `section`) in place. A field
    whose variable is unset keeps its text, and the error naming the field is kept on the node for
    `resolved`. Returns {dotted field: value as written} of the fields expanded."""
    raw, errors = {}, {}
    for key in keys:
        text = getattr(node, key)
        if "$" not in text:
            continue
        try:
            setattr(node, key, expand_env(text, f"{section}.{key}"))
        except ConfigError as exc:
            errors[key] = (text, exc)
            continue
        raw[f"{section}.{key}"] = text
    object.__setattr__(node, "_env_errors", errors)
    return raw


def resolved(node, key: str) -> str:
    """A path field as every layer reads it: the value expanded at load. When its variable was unset
    then, the error recorded at load (the field, what to export) is raised now that the path is needed."""
    value = getattr(node, key)
    text, error = getattr(node, "_env_errors", {}).get(key, (None, None))
    if error is not None and value == text:
        raise error
    return value


def env_fix(field_name: str, var: str, alternatives: tuple[str, ...] = ()) -> str:
    """The fix line of an unset ${var} in `field_name`: what to export, and what the value must be."""
    example, what = ENV_PATH_FIELDS.get(field_name) or (_DISTILL_FIX if field_name.startswith("distill.") else (f"<{field_name}>", ""))
    fix = f"export {var}={example}"
    if alternatives:
        fix += " (or " + ", ".join(f"{a}=..." for a in alternatives) + ")"
    if what:
        fix += f"  ({what.format(var=var)})"
    return fix


def expand_env(text: str, field_name: str) -> str:
    """Expand ${VAR} and ${VAR:-fallback} (the fallback may itself be $OTHER) as a shell does: a set
    variable, even an empty one, gives its value; ${VAR:-fallback} takes the fallback when VAR is unset
    or empty. A variable that is unset with no fallback that resolves is an error naming the variable,
    the field and what the field must point at: an unset variable is a forgotten export, and an
    expansion to "" would silently point somewhere else."""

    def one(match: re.Match) -> str:
        name, fallback = match.group(1), match.group(2)
        value = os.environ.get(name)
        if fallback is None:
            if value is not None:
                return value
            raise ConfigError(field_name, f"uses ${{{name}}}, which is not set", env_fix(field_name, name))
        if value:
            return value
        unset = [a or b for a, b in _VAR_REF.findall(fallback) if (a or b) not in os.environ]
        if not unset:
            return os.path.expandvars(fallback)
        state = "is empty" if value is not None else "is not set"
        raise ConfigError(
            field_name, f"uses ${{{name}:-{fallback}}}: {name} {state} and the fallback's {', '.join(unset)} "
            f"{'is' if len(unset) == 1 else 'are'} not set", env_fix(field_name, name, tuple(unset)),
        )

    return _ENV_REF.sub(one, text)


def env_references(text: str) -> list[str]:
    """Every variable a field value reads, fallbacks included, in order."""
    names = []
    for match in _ENV_REF.finditer(text):
        names.append(match.group(1))
        names.extend(a or b for a, b in _VAR_REF.findall(match.group(2) or ""))
    return names


def _from_env(raw: dict[str, str], field_name: str) -> str:
    return f" ({raw[field_name]} with {', '.join(env_references(raw[field_name]))} set but empty)" if field_name in raw else ""


def _empty_fix(raw: dict[str, str], field_name: str) -> str:
    """The fix of a required path field left empty: export its variable, or set the field."""
    names = env_references(raw.get(field_name, ""))
    if names:
        return env_fix(field_name, names[0], tuple(names[1:]))
    example, what = ENV_PATH_FIELDS[field_name]
    return f"--set {field_name}={example}  ({what})"
