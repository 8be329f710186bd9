"""repdegen's Hydra configs (this folder): a package so that the installed wheel carries them and
``importlib.resources.files("repdegen.conf")`` finds them, in a wheel or in a checkout alike."""
