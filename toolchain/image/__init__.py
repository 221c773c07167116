"""The image: a base (bootstrap), the user stage, one layer per wheel or group of small wheels with its
bytecode (venv_plan, venv_layer, bytecode, deps_stage), the app and spec layers (images, layers), and
the provenance that lets a build with no engine start from the image a registry holds (provenance,
previous_image, registry_build)."""
