"""Validate the workflow configuration against its JSON schema, with errors that name the key path."""

from __future__ import annotations

import copy
import functools
import reprlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import jsonschema
import referencing
import referencing.jsonschema
import yaml

from ddlrepro.host.catalog import SCALE_FILES, figure_file, figure_ids
from ddlrepro.host.errors import UserError

# Shipped with the package (package data), so an installed ddlrepro validates without a checkout.
SCHEMAS = Path(__file__).with_name("schemas")
CONFIG_SCHEMA = SCHEMAS / "config.schema.yaml"
VARIABLE_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # the schema's pattern of an environment variable's name


def read_yaml(text: str | bytes) -> Any:
    """YAML's safe subset, parsed by libyaml where PyYAML has it (ten times faster: the references and the schema are
    read by every plot and check)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class ConfigError(UserError):
    """The configuration does not satisfy its schema; the message lists every problem by key path."""


# A value in a problem's line: cut, never its whole repr (a value may be huge).
SHORT = reprlib.Repr()
SHORT.maxlevel, SHORT.maxdict, SHORT.maxlist, SHORT.maxstring, SHORT.maxother = 3, 8, 8, 200, 200


def brief(text: str, characters: int) -> str:
    return text if len(text) <= characters else text[:characters] + f"… ({len(text) - characters} more characters)"


def key_path(path: Any) -> str:
    """Render a jsonschema path deque as `figures.kungfu-fig9.workers[0]`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top level>"


def describe(error: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    """One line per problem: the key path, then what is wrong and what would be valid."""
    where = key_path(error.absolute_path)
    if holds_secrets(list(error.absolute_path)):
        return f"{where}: {_redaction_problem(error, schema)}"
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted(_property_names(_subschema_of(error), schema))
        unknown = sorted(set(error.instance if isinstance(error.instance, Mapping) else {}) - set(allowed))
        return f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
    values = _listed(error.validator_value) if error.validator == "enum" else choices(error)
    if values:
        return f"{where}: {SHORT.repr(error.instance)} is not valid; valid values: {', '.join(map(str, values))}"
    subschema = _subschema_of(error)
    if error.validator == "pattern" and "description" in subschema:  # the pattern says less than its description
        return f"{where}: {SHORT.repr(error.instance)} is not valid: {subschema['description'].strip()}"
    if error.validator == "oneOf":
        described = subschema.get("description", "see the schema")
        return f"{where}: {SHORT.repr(error.instance)} is not valid: {described}"
    return f"{where}: {error.message}"


def _subschema_of(error: jsonschema.ValidationError) -> Mapping[str, Any]:
    """The schema an error was found under; jsonschema's types also allow a boolean schema (whose errors name no
    keyword read here) and an unset one (only in errors built by hand): both read as empty."""
    return error.schema if isinstance(error.schema, Mapping) else {}


def _listed(value: object) -> list[Any]:
    """An `enum`'s values: a list, as JSON Schema requires (jsonschema's types also allow an unset one: empty)."""
    return value if isinstance(value, list) else []


def choices(error: jsonschema.ValidationError) -> list[Any]:
    """The values an anyOf/oneOf of constants and enums allows (empty when a branch is something else)."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return []
    values: list[Any] = []
    for branch in error.context:
        if branch.validator not in ("const", "enum"):
            return []
        values += [branch.validator_value] if branch.validator == "const" else _listed(branch.validator_value)
    return values


def holds_secrets(path: list[Any]) -> bool:
    """Whether a key path is one where a secret may have been written by mistake (`redaction`, a figure's object
    `store`): its problems are described without the value."""
    return path[:1] == ["redaction"] or (len(path) >= 3 and path[0] == "figures" and path[2] == "store")


def _redaction_problem(error: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    """What is wrong under `redaction` (or a store), never echoing what was written there: it may be the secret."""
    if error.validator in ("required", "dependentRequired"):
        return error.message  # names keys only
    if error.validator == "pattern" and error.validator_value == VARIABLE_NAME:
        return "not an environment variable name (give names only, never values)"
    if error.validator == "pattern":
        return f"does not match {error.validator_value} (what was written is not shown: it may be a secret)"
    if error.validator == "type":
        return f"must be of type {error.validator_value} (give names only, never values)"
    if error.validator == "uniqueItems":
        return "names a variable twice"
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(_property_names(_subschema_of(error), schema)))
        return f"unknown key(s), not shown (one may be a secret); allowed: {allowed}"
    return f"does not satisfy the schema's `{error.validator}` (what was written is not shown: it may be a secret)"


def _property_names(subschema: Mapping[str, Any], schema: dict[str, Any]) -> set[str]:
    """Keys a subschema allows, including those of a local `$ref` (`#/$defs/...`) it extends."""
    names = set(subschema.get("properties", {}))
    reference = subschema.get("$ref", "")
    if reference.startswith("#/$defs/"):
        names |= _property_names(schema["$defs"][reference.removeprefix("#/$defs/")], schema)
    return names


# A config or references file holds a few thousand values; YAML aliases let a file of a few hundred bytes stand for
# billions, which every later step (the schema's error messages included) would expand.
MAX_VALUES = 200_000
MAX_PROBLEM_CHARACTERS = 400  # of one schema problem's line: a message may hold the offending value


def refuse_expanded_size(instance: Any, name: str, limit: int = MAX_VALUES) -> None:
    """ConfigError when `instance`, its YAML aliases expanded, holds more than `limit` values (counted only up to
    the limit, so the check itself stays small)."""
    count, pending = 0, [instance]
    while pending:
        value = pending.pop()
        count += 1
        if count > limit:
            raise ConfigError(
                f"invalid {name}: more than {limit} values once its YAML aliases are expanded; refused before"
                " validating (MAX_VALUES in ddlrepro.host.config)"
            )
        if isinstance(value, dict):
            pending += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            pending += value


def validate_against(instance: Any, schema_path: Path, name: str, schema: dict[str, Any] | None = None) -> None:
    """Fill in the schema's defaults, then raise ConfigError listing every violation of the schema in `instance`
    (`name`: the file, for the message)."""
    refuse_expanded_size(instance, name)
    schema = schema or read_yaml(schema_path.read_text())
    coerce_strings(instance, schema, schema)
    registry = sibling_schemas(schema_path.parent)
    validator = DefaultFillingValidator(schema, registry=registry)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        # errors inside a sibling schema name its `#/$defs/...`: describe them with every file's definitions
        definitions = {"$defs": {**sibling_definitions(schema, registry), **schema.get("$defs", {})}}
        problems = (describe(leaf, definitions) for error in errors for leaf in _leaves(error))
        lines = "\n".join(f"  - {brief(problem, MAX_PROBLEM_CHARACTERS)}" for problem in problems)
        raise ConfigError(f"invalid {name} (schema {schema_path.name}):\n{lines}")


BOOLEANS = {"true": True, "false": False}


def coerce_strings(value: Any, schema: Any, root: dict[str, Any]) -> Any:
    """`value` with the strings the schema wants as booleans or numbers turned into them, in place (Snakemake passes
    nested `--config` values as strings: `figures={kungfu-fig4: {enabled: false}}` gives 'false'). Only where no
    string is valid; what does not parse stays, for the schema to name."""
    branches = schema_branches(schema, root)
    if isinstance(value, dict):
        for key in value:
            for branch in branches:
                properties, extra = branch.get("properties", {}), branch.get("additionalProperties")
                sub = properties.get(key, extra if isinstance(extra, dict) else None)
                if sub is not None:
                    value[key] = coerce_strings(value[key], sub, root)
    elif isinstance(value, list):
        for branch in branches:
            if isinstance(branch.get("items"), dict):
                value[:] = [coerce_strings(item, branch["items"], root) for item in value]
    elif isinstance(value, str):
        return coerced_scalar(value, {kind for branch in branches for kind in schema_types(branch)})
    return value


def schema_branches(schema: Any, root: dict[str, Any]) -> list[dict[str, Any]]:
    """The schema and its anyOf/oneOf/allOf branches, local `$ref`s followed (another file's are not)."""
    if not isinstance(schema, dict):
        return []
    reference = schema.get("$ref", "")
    if reference.startswith("#/"):
        return [schema, *schema_branches(local_definition(root, reference), root)]
    nested = [branch for key in ("anyOf", "oneOf", "allOf") for branch in schema.get(key, [])]
    return [schema, *(sub for branch in nested for sub in schema_branches(branch, root))]


def local_definition(root: dict[str, Any], reference: str) -> Any:
    """What a local `$ref` (`#/$defs/name/properties/key`) points to in `root` ({} where nothing is)."""
    target: Any = root
    for part in reference.removeprefix("#/").split("/"):
        target = target.get(part, {}) if isinstance(target, dict) else {}
    return target


def schema_types(schema: dict[str, Any]) -> set[str]:
    kinds = schema.get("type", [])
    return {kinds} if isinstance(kinds, str) else set(kinds)


def coerced_scalar(text: str, kinds: set[str]) -> Any:
    if "string" in kinds or not kinds:
        return text
    if "boolean" in kinds and text.strip().lower() in BOOLEANS:
        return BOOLEANS[text.strip().lower()]
    for kind, parse in (("integer", int), ("number", float)):
        if kind in kinds:
            try:
                return parse(text)
            except ValueError:
                pass
    return text


def sibling_schemas(folder: Path) -> referencing.Registry:
    """Resolves a `$ref` to another schema file in `folder`, e.g. `references.schema.yaml#/$defs/reference`."""

    def retrieve(name: str) -> referencing.Resource:
        contents = read_yaml((folder / name).read_text())
        return referencing.Resource.from_contents(contents, referencing.jsonschema.DRAFT202012)

    return referencing.Registry(retrieve=retrieve)  # type: ignore[call-arg]  # referencing's attrs-made __init__


def sibling_definitions(schema: Any, registry: referencing.Registry) -> dict[str, Any]:
    """The `$defs` of every sibling schema file that `schema` refers to."""
    if isinstance(schema, list):
        return {key: value for item in schema for key, value in sibling_definitions(item, registry).items()}
    if not isinstance(schema, dict):
        return {}
    found = {key: value for item in schema.values() for key, value in sibling_definitions(item, registry).items()}
    reference = schema.get("$ref", "#")
    if not reference.startswith("#"):
        found |= registry.get_or_retrieve(reference.split("#")[0]).value.contents.get("$defs", {})
    return found


def _fill_defaults(validator_class: type[jsonschema.protocols.Validator]) -> type[jsonschema.protocols.Validator]:
    """`validator_class` whose `properties` first sets every missing property that has a `default` (a copy of it),
    then validates: jsonschema's documented way to have the schema's defaults filled in while validating. A
    section's `default: {}` lets its own keys' defaults be filled in too."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(
        validator: jsonschema.protocols.Validator, properties: dict[str, Any], instance: Any, schema: dict[str, Any]
    ) -> Iterator[jsonschema.ValidationError]:
        if isinstance(instance, dict):
            for key, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(key, copy.deepcopy(subschema["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    extended = jsonschema.validators.extend(validator_class, {"properties": set_defaults})  # type: ignore[no-untyped-call]  # untyped in jsonschema's stubs
    return cast("type[Any]", extended)


DefaultFillingValidator = _fill_defaults(jsonschema.Draft202012Validator)


@functools.cache
def config_schema() -> dict[str, Any]:
    """The config schema, read once: schemas/config.schema.yaml with each figure's section from its folder's
    schema.yaml (catalog.py), and the list of figure ids from the folders found."""
    schema = read_yaml(CONFIG_SCHEMA.read_text())
    figures = schema["properties"]["figures"]
    figures["properties"] = {figure: read_yaml_file(figure_file(figure, "schema.yaml")) for figure in figure_ids()}
    figures["required"] = list(figure_ids())
    schema["$defs"]["figure_id"]["enum"] = list(figure_ids())
    return cast("dict[str, Any]", schema)


def _schema_node(keys: tuple[str, ...]) -> dict[str, Any]:
    node = config_schema()
    for key in keys:
        node = node["properties"][key]
    return node


def schema_default(*keys: str) -> Any:
    """The default the config schema declares at a key path, e.g. `schema_default("checks", "max_foreign_share")`:
    code that needs a setting the user left out reads it here, so the schema stays its one source."""
    return _schema_node(keys)["default"]


def validate_config(config: dict[str, Any], partial: bool = False) -> dict[str, Any]:
    """Resolve the scale's figure sections (`resolve_scale`), fill in the schema's defaults (in place, so every
    caller sees the same filled config) and raise ConfigError listing every schema violation in `config`, each with
    its key path. `partial`: only the sections given need be there (e.g. a command's `launcher` and `images`), and
    no figure's section is added (the figures' folders are read only for a whole configuration). Returns `config`."""
    refuse_expanded_size(config, "configuration")
    if not partial:
        resolve_scale(config)
    schema = copy.deepcopy(config_schema())  # the schema read once; a partial check drops its copy's `required`
    if partial:
        schema.pop("required", None)
    validate_against(config, CONFIG_SCHEMA, "configuration", schema)
    return config


def resolve_scale(config: dict[str, Any]) -> None:
    """`figures` ← the active scale's block (`smoke` or `paper`), overridden by the config's own `figures`.

    The block is every figure folder's smoke.yaml or paper.yaml (`folder_block`), under a block of the same name
    in the config (which changes a scale's sizes for every run at that scale). Each scale's figure sections live
    apart, so a paper-scale point never takes a smoke value: what the paper block leaves out is the schema's
    default. The other scale's block is dropped; every figure the active block names is enabled unless `figures`
    says otherwise. Idempotent: a resolved config resolves to itself."""
    scale = config.get("scale", schema_default("scale"))
    for other in set(SCALE_BLOCKS) - {scale}:
        config.pop(other, None)
    block = config.get(scale, {})
    if scale not in SCALE_BLOCKS or not isinstance(block, dict):
        return  # the schema names what is wrong
    sections = scale_sections(scale, merge_into(folder_block(scale), copy.deepcopy(block)))
    config["figures"] = merge_into(sections, copy.deepcopy(config.get("figures") or {}))


SCALE_BLOCKS = tuple(SCALE_FILES)


def folder_block(scale: str) -> dict[str, Any]:
    """A scale's block as the figures' folders give it: each figure's smoke.yaml or paper.yaml, by figure id."""
    block = {}
    for figure in figure_ids():
        path = figure_file(figure, SCALE_FILES[scale])
        block[figure] = read_yaml_file(path)
        if not isinstance(block[figure], dict):
            raise ConfigError(f"{path}: a figure's {scale} section must be a mapping of its keys")
    return block


def scale_sections(scale: str, block: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A scale block's figure sections as plain values, each figure enabled. The paper block's entries are
    `{value, source}`: the value and where the paper or its artifact gives it (docs/paper-scale.md lists them)."""
    problems = [f"  - {where}: {problem}" for where, problem in _block_problems(scale, block)]
    if problems:
        raise ConfigError(f"invalid configuration (its {scale} block):\n" + "\n".join(problems))
    sourced = scale == "paper"
    return {
        figure: {"enabled": True}
        | {key: copy.deepcopy(entry["value"] if sourced else entry) for key, entry in section.items()}
        for figure, section in block.items()
    }


def _block_problems(scale: str, block: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for figure, section in block.items():
        if not isinstance(section, dict):
            yield f"{scale}.{figure}", "a figure's section must be a mapping of its keys"
            continue
        for key, entry in section.items() if scale == "paper" else ():
            if not (isinstance(entry, dict) and set(entry) == {"value", "source"}):
                yield (
                    f"{scale}.{figure}.{key}",
                    'must be {value: ..., source: "..."} (each paper value names its source)',
                )
            elif not (isinstance(entry["source"], str) and entry["source"].strip()):
                yield (
                    f"{scale}.{figure}.{key}",
                    "its source must be a non-empty string: the paper or artifact file:line",
                )


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For allOf/anyOf errors report the specific failing sub-errors, not the umbrella."""
    if error.validator == "allOf" and error.context:
        return [leaf for sub in error.context for leaf in _leaves(sub)]
    if error.validator in ("oneOf", "anyOf") and error.context and "description" not in _subschema_of(error):
        return _leaves(jsonschema.exceptions.best_match(error.context))
    return [error]


def read_yaml_file(path: Path) -> Any:
    """A YAML file's value; ConfigError names the file, and the line and column where YAML can tell."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read the file: {error}") from None
    try:
        return read_yaml(text)
    except yaml.MarkedYAMLError as error:
        raise ConfigError(f"{path}:{_yaml_position(error)}: not valid YAML: {_yaml_problem(error, text)}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None


def load_config_file(path: Path) -> dict[str, Any]:
    """One config file's mapping; ConfigError names the file, and the line and column where YAML can tell."""
    value = read_yaml_file(path)
    if value is None:
        raise ConfigError(f"{path}: the config file is empty (it needs at least one key, e.g. `scale: smoke`)")
    if not isinstance(value, dict):
        raise ConfigError(f"{path}:1:1: the top level must be a mapping of keys, not a {type(value).__name__}")
    return value


def _yaml_position(error: yaml.MarkedYAMLError) -> str:
    """`line:column` (1-based) of the problem, or of its context when the problem itself has no mark."""
    mark = error.problem_mark or error.context_mark
    return f"{mark.line + 1}:{mark.column + 1}" if mark else "?"


def _yaml_problem(error: yaml.MarkedYAMLError, text: str) -> str:
    problem = " ".join(part for part in (error.context, error.problem) if part)
    mark = error.problem_mark or error.context_mark
    lines = text.splitlines()
    if mark and mark.line < len(lines) and "\t" in lines[mark.line]:
        return f"{problem} (a tab in the indentation: YAML indents with spaces only)"
    return problem


def load_config(*paths: Path) -> dict[str, Any]:
    """Load and merge YAML config files in order (later ones override), as Snakemake does, then validate."""
    merged: dict[str, Any] = {}
    for path in paths:
        merge_into(merged, load_config_file(path))
    validate_config(merged)
    return merged


def merge_into(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value
    return base
