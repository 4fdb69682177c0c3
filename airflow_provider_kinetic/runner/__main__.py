from airflow_provider_kinetic.runner.remote import main

if __name__ == "__main__":
    main()
