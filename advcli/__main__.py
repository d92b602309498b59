from advcli.cli import app

app(prog_name="advcli")
