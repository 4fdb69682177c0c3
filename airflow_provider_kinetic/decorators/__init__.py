"""``@task.kinetic``: the TaskFlow form of ``KineticRunOperator`` (registered through
provider info).  Top of the package: uses only the operators.
"""
