"""devcontainer.json: what is read from it, what is refused by name, and where it is found."""

from __future__ import annotations

import json

import pytest

from bridge.environments.devcontainer import (
    DEVCONTAINER_PATHS,
    MAX_BYTES,
    DevcontainerBuild,
    find_devcontainer,
    parse_devcontainer,
)
from bridge.errors import InvalidSpec

PATH = ".devcontainer/devcontainer.json"
IMAGE = {"image": "python:3.11"}


def parse(doc: dict, path: str = PATH):
    return parse_devcontainer(json.dumps(doc), path)


def refused(doc: dict | str | bytes, path: str = PATH) -> str:
    text = doc if isinstance(doc, str | bytes) else json.dumps(doc)
    with pytest.raises(InvalidSpec) as info:
        parse_devcontainer(text, path)
    message = str(info.value)
    assert path in message
    assert message.endswith(".") and ". " not in message, message  # one sentence
    return message


def test_jsonc_with_comments_and_trailing_commas_parses():
    text = b"""// the project's toolchain
    {
        /* a block comment */
        "image": "node:20", // trailing comment
        "forwardPorts": [3000,],
        "customizations": {"vscode": {"extensions": ["dbaeumer.vscode-eslint",],},},
    }
    """
    devcontainer = parse_devcontainer(text, PATH)
    assert devcontainer.image == "node:20"
    assert devcontainer.build is None


def test_a_byte_order_mark_is_tolerated():
    assert parse_devcontainer(b'\xef\xbb\xbf{"image": "x"}', PATH).image == "x"


def test_the_image_form_gives_the_image_and_the_defaults():
    devcontainer = parse(IMAGE)
    assert devcontainer.path == PATH
    assert devcontainer.image == "python:3.11"
    assert devcontainer.build is None
    assert devcontainer.container_env == {}
    assert devcontainer.setup == []
    assert devcontainer.container_user is None


def test_build_paths_are_relative_to_the_devcontainer_folder():
    devcontainer = parse({"build": {"dockerfile": "Dockerfile", "context": ".."}})
    assert devcontainer.image is None
    assert devcontainer.build == DevcontainerBuild(
        dockerfile=".devcontainer/Dockerfile", context=".", args={}, target=None
    )


def test_the_build_context_defaults_to_the_devcontainer_folder():
    build = parse({"build": {"dockerfile": "./docker//Dockerfile"}}).build
    assert build.context == ".devcontainer"
    assert build.dockerfile == ".devcontainer/docker/Dockerfile"


def test_a_root_devcontainer_json_resolves_from_the_repository_root():
    build = parse({"build": {"dockerfile": "ci/Dockerfile"}}, ".devcontainer.json").build
    assert (build.dockerfile, build.context) == ("ci/Dockerfile", ".")


def test_build_args_and_target_are_read():
    doc = {"build": {"dockerfile": "Dockerfile", "args": {"V": "3.11"}, "target": "dev"}}
    build = parse(doc).build
    assert (build.args, build.target) == ({"V": "3.11"}, "dev")


def test_the_legacy_top_level_dockerfile_and_context_are_read():
    build = parse({"dockerFile": "../Dockerfile", "context": ".."}).build
    assert (build.dockerfile, build.context) == ("Dockerfile", ".")


def test_the_three_command_shapes_flatten_in_lifecycle_order():
    doc = {
        **IMAGE,
        "postCreateCommand": {"test": "pytest --co -q", "deps": ["pip", "install", "-e", ".[t]"]},
        "onCreateCommand": "npm ci",
        "updateContentCommand": ["echo", "it's here"],
    }
    assert parse(doc).setup == [
        "npm ci",
        "echo 'it'\"'\"'s here'",
        "pytest --co -q",
        "pip install -e '.[t]'",
    ]


def test_shell_variables_in_commands_are_the_shells_own():
    assert parse({**IMAGE, "postCreateCommand": "echo ${HOME}"}).setup == ["echo ${HOME}"]


def test_environment_and_user_are_recorded():
    doc = {
        **IMAGE,
        "containerEnv": {"A": "1", "B": "2"},
        "remoteEnv": {"B": "3"},
        "remoteUser": "vscode",
    }
    devcontainer = parse(doc)
    assert devcontainer.container_env == {"A": "1", "B": "3"}
    assert devcontainer.container_user == "vscode"


def test_editor_only_keys_are_ignored():
    doc = {
        **IMAGE,
        "name": "dev",
        "$schema": "https://example.invalid/schema.json",
        "portsAttributes": {"3000": {"label": "app"}},
        "otherPortsAttributes": {},
        "shutdownAction": "none",
        "overrideCommand": True,
        "waitFor": "postCreateCommand",
        "userEnvProbe": "loginShell",
        "updateRemoteUserUID": False,
        "hostRequirements": {"cpus": 2},
        "workspaceFolder": "/src",
    }
    assert parse(doc).image == "python:3.11"


@pytest.mark.parametrize(
    "key",
    [
        "features",
        "runArgs",
        "mounts",
        "workspaceMount",
        "privileged",
        "capAdd",
        "securityOpt",
        "init",
        "appPort",
        "runServices",
        "service",
        "dockerComposeFile",
    ],
)
def test_a_key_that_changes_privileges_mounts_or_network_is_refused_by_name(key):
    message = refused({**IMAGE, key: ["x"]})
    assert f"`{key}`" in message and "does not support" in message


def test_features_are_refused_with_the_advice_to_bake_them_in():
    assert "bake them into the image" in refused({**IMAGE, "features": {}})


def test_a_compose_devcontainer_is_refused_as_unsupported():
    assert "compose" in refused({"dockerComposeFile": "compose.yml", "service": "app"})


def test_initialize_command_is_refused_because_it_would_run_on_the_host():
    message = refused({**IMAGE, "initializeCommand": "make"})
    assert "`initializeCommand`" in message and "host" in message


@pytest.mark.parametrize("key", ["postStartCommand", "postAttachCommand"])
def test_start_and_attach_commands_are_refused_pointing_to_post_create(key):
    message = refused({**IMAGE, key: "make"})
    assert f"`{key}`" in message and "postCreateCommand" in message


def test_an_unknown_key_is_refused_as_unknown():
    message = refused({**IMAGE, "foo": 1})
    assert "`foo`" in message and "does not know" in message


@pytest.mark.parametrize(
    ("build", "named"),
    [
        ({"dockerfile": "Dockerfile", "cacheFrom": "x"}, "build.cacheFrom"),
        ({"dockerfile": "Dockerfile", "options": ["--x"]}, "build.options"),
        ({"dockerfile": "Dockerfile", "platform": "arm64"}, "build.platform"),
        ({"context": "."}, "build.dockerfile"),
        ({"dockerfile": "Dockerfile", "args": {"V": 3}}, "build.args.V"),
        ({"dockerfile": "Dockerfile", "args": {"V": True}}, "build.args.V"),
        ({"dockerfile": "Dockerfile", "target": ""}, "build.target"),
    ],
)
def test_a_build_we_cannot_honour_is_refused_naming_the_key(build, named):
    assert f"`{named}`" in refused({"build": build})


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({}, "`image`"),
        ({"name": "only a name"}, "`build.dockerfile`"),
        ({**IMAGE, "build": {"dockerfile": "Dockerfile"}}, "`build`"),
        ({**IMAGE, "dockerFile": "Dockerfile"}, "`dockerFile`"),
        ({"build": {"dockerfile": "D"}, "dockerFile": "D"}, "`dockerFile`"),
        ({"image": ""}, "`image`"),
        ({"image": 3}, "`image`"),
        ({"context": ".."}, "`context`"),
    ],
)
def test_not_exactly_one_image_or_dockerfile_is_refused(doc, named):
    assert named in refused(doc)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        ({"dockerfile": "../../Dockerfile"}, "build.dockerfile"),
        ({"dockerfile": "Dockerfile", "context": "../.."}, "build.context"),
        ({"dockerfile": "/etc/Dockerfile"}, "build.dockerfile"),
        ({"dockerfile": "Dockerfile", "context": "/"}, "build.context"),
    ],
)
def test_a_path_escaping_the_repository_is_refused(build, named):
    assert f"`{named}`" in refused({"build": build})


def test_a_dockerfile_outside_the_context_is_refused_saying_so():
    message = refused({"build": {"dockerfile": "../Dockerfile", "context": "."}})
    assert "`build.dockerfile`" in message and "inside the build context" in message


@pytest.mark.parametrize(
    ("doc", "named", "variable"),
    [
        ({"containerEnv": {"P": "${containerEnv:PATH}:/x"}}, "containerEnv.P", "containerEnv:"),
        ({"remoteEnv": {"T": "${localEnv:TOKEN}"}}, "remoteEnv.T", "localEnv:TOKEN"),
        ({"containerEnv": {"H": "${HOME}"}}, "containerEnv.H", "HOME"),
        ({"postCreateCommand": "cd ${containerWorkspaceFolder}"}, "postCreateCommand", "Work"),
        ({"onCreateCommand": {"a": ["cat", "${localEnv:X}"]}}, "onCreateCommand.a", "localEnv"),
    ],
)
def test_a_devcontainer_variable_is_refused_naming_it(doc, named, variable):
    message = refused({**IMAGE, **doc})
    assert f"`{named}`" in message and variable in message


def test_a_variable_in_a_build_arg_is_refused():
    doc = {"build": {"dockerfile": "Dockerfile", "args": {"W": "${localWorkspaceFolder}"}}}
    message = refused(doc)
    assert "`build.args.W`" in message and "${localWorkspaceFolder}" in message


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"containerEnv": {"N": 1}}, "containerEnv.N"),
        ({"containerEnv": ["A=1"]}, "containerEnv"),
        ({"remoteEnv": {"A=B": "1"}}, "remoteEnv"),
        ({"postCreateCommand": 1}, "postCreateCommand"),
        ({"postCreateCommand": {"x": {"y": "z"}}}, "postCreateCommand.x"),
        ({"onCreateCommand": ["make", 1]}, "onCreateCommand"),
        ({"containerUser": ""}, "containerUser"),
    ],
)
def test_a_value_of_the_wrong_shape_is_refused_naming_the_key(doc, named):
    assert f"`{named}`" in refused({**IMAGE, **doc})


def test_a_file_that_is_not_jsonc_is_refused_with_its_line():
    message = refused('{\n  "image": "x",\n  "name": \n}')
    assert "line 4" in message


@pytest.mark.parametrize(
    "text",
    ['["image"]', '{"image": "a", "image": "b"}', b"\xff\xfe{}", "", "[" * 5000],
)
def test_a_file_that_is_not_one_json_object_is_refused(text):
    refused(text)


def test_an_oversized_file_is_refused_before_it_is_parsed():
    assert "KiB" in refused(b" " * (MAX_BYTES + 1))


class Repo:
    """A `read` over a dict of files, recording what was asked for."""

    def __init__(self, *paths: str) -> None:
        self.files = {path: b"{}" for path in paths}
        self.asked: list[str] = []

    def __call__(self, path: str) -> bytes | None:
        self.asked.append(path)
        return self.files.get(path)


def test_find_prefers_the_devcontainer_folder_over_the_root_file():
    assert find_devcontainer(Repo(*DEVCONTAINER_PATHS), True) == ".devcontainer/devcontainer.json"
    assert find_devcontainer(Repo(".devcontainer.json"), True) == ".devcontainer.json"


def test_find_refuses_a_repository_without_one_naming_where_it_looked():
    with pytest.raises(InvalidSpec) as info:
        find_devcontainer(Repo("README.md"), True)
    assert all(path in str(info.value) for path in DEVCONTAINER_PATHS)


def test_find_honours_an_explicit_path():
    repo = Repo(*DEVCONTAINER_PATHS, ".devcontainer/python/devcontainer.json")
    path = find_devcontainer(repo, "./.devcontainer/python/devcontainer.json")
    assert path == ".devcontainer/python/devcontainer.json"
    assert repo.asked == [path]


def test_find_refuses_a_missing_explicit_path_naming_it():
    with pytest.raises(InvalidSpec, match="ci/devcontainer.json"):
        find_devcontainer(Repo(*DEVCONTAINER_PATHS), "ci/devcontainer.json")


@pytest.mark.parametrize("requested", ["/etc/devcontainer.json", "../x.json", "a/../b.json", ""])
def test_find_refuses_a_path_outside_the_repository_without_reading(requested):
    repo = Repo("b.json")
    with pytest.raises(InvalidSpec, match="environment.devcontainer"):
        find_devcontainer(repo, requested)
    assert repo.asked == []


def test_the_images_a_dockerfile_builds_from_are_found_stages_and_args_included():
    from bridge.environments.dockerfile import dockerfile_images

    text = (
        "# syntax comment\n"
        "ARG BASE=debian:12\n"
        "ARG TOOLS\n"
        "FROM --platform=linux/amd64 ${BASE} AS build\n"
        "RUN --mount=type=cache,target=/c --mount=type=bind,from=cache-img:2,target=/x \\\n"
        "    echo --from=not-an-image\n"
        "FROM $TOOLS AS tools\n"
        "FROM scratch\n"
        "COPY --from=build /out /out\n"
        "COPY --from=0 /a /a\n"
        "COPY --from=helper:1 /b /b\n"
    )
    found = dockerfile_images(text, {"TOOLS": "tools:3"}, "Dockerfile")
    assert found == ["debian:12", "cache-img:2", "tools:3", "helper:1"]
    with pytest.raises(InvalidSpec, match=r"\$TOOLS"):
        dockerfile_images(text, {}, "Dockerfile")
